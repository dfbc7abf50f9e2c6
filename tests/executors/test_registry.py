"""Registries: normalized names, lazy factories called once, collision rules of the reference."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mixle_parallel.executors import (
    available_encoded_data_backends,
    available_training_backends,
    get_encoded_data_backend,
    get_training_backend,
    register_encoded_data_backend,
    register_training_backend,
    unregister_encoded_data_backend,
    unregister_training_backend,
)


class Backend:
    """A minimal backend instance: has prepare()."""

    def prepare(self, module: Any, *, plan: Any, **kwargs: Any) -> Any:
        return module


@pytest.fixture
def cleanup() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        unregister_training_backend(name)
        unregister_encoded_data_backend(name)


def test_names_are_normalized(cleanup: list[str]) -> None:
    cleanup.append("my_backend")
    backend = Backend()
    register_training_backend("  My-Backend ", backend)
    assert get_training_backend("my_backend") is backend
    assert get_training_backend("MY-BACKEND") is backend
    assert "my_backend" in available_training_backends()


def test_lazy_factory_is_called_once(cleanup: list[str]) -> None:
    cleanup.append("lazy")
    calls: list[int] = []

    def factory() -> Backend:
        calls.append(1)
        return Backend()

    register_training_backend("lazy", factory)
    assert calls == []
    first = get_training_backend("lazy")
    assert get_training_backend("lazy") is first and calls == [1]


def test_a_class_is_a_lazy_factory(cleanup: list[str]) -> None:
    cleanup.append("cls")
    register_training_backend("cls", Backend)
    assert isinstance(get_training_backend("cls"), Backend)


def test_collisions_need_override(cleanup: list[str]) -> None:
    cleanup.append("taken")
    a, b = Backend(), Backend()
    register_training_backend("taken", a)
    register_training_backend("taken", a)  # identical: no-op
    with pytest.raises(ValueError, match="already registered.*override=True"):
        register_training_backend("Taken", b)
    register_training_backend("taken", b, override=True)
    assert get_training_backend("taken") is b


def test_unknown_backend_lists_available() -> None:
    with pytest.raises(KeyError, match="unknown training backend 'nope'; available"):
        get_training_backend("nope")
    with pytest.raises(KeyError, match="unknown encoded-data backend"):
        get_encoded_data_backend("nope")


@pytest.mark.parametrize("name", ["", "   "])
def test_blank_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        register_training_backend(name, Backend())


def test_non_string_names_are_rejected() -> None:
    with pytest.raises(TypeError, match="must be a str"):
        register_training_backend(3, Backend())  # type: ignore[arg-type]


def test_encoded_data_aliases_and_collisions(cleanup: list[str]) -> None:
    cleanup.extend(["engine_x", "ex", "engine_y"])

    def factory(data: Any, **params: Any) -> Any:
        return data

    def other(data: Any, **params: Any) -> Any:
        return data

    register_encoded_data_backend("Engine-X", factory, aliases=("EX",))
    register_encoded_data_backend("engine_x", factory, aliases=("ex",))  # identical: no-op
    assert get_encoded_data_backend("ex") is factory
    assert {"engine_x", "ex"} <= set(available_encoded_data_backends())
    with pytest.raises(ValueError, match="'ex' is already registered"):
        register_encoded_data_backend("engine_y", other, aliases=("ex",))
    assert "engine_y" not in available_encoded_data_backends()  # nothing bound on a collision
    register_encoded_data_backend("engine_y", other, aliases=("ex",), override=True)
    assert get_encoded_data_backend("ex") is other


def test_encoded_data_factory_must_be_callable_and_aliases_a_sequence() -> None:
    with pytest.raises(TypeError, match="callable"):
        register_encoded_data_backend("bad", 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence of names"):
        register_encoded_data_backend("bad", lambda d: d, aliases="b")  # type: ignore[arg-type]
