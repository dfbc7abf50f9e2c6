"""The options of an encoded-data handle as two frozen objects, validated where they are made.

:class:`EncodedDataOptions` is the one handle signature: ``encoded_data``, ``fit``, ``optimize``,
``stochastic_em``, the reference handle classes, ``ModelParallelEncodedData`` and
``handle_from_runner`` all build it at once from their keywords and pass it on.
:class:`VerificationOptions` carries the verification controls (admission, SDC audit, ledger,
fault injection) the same way. Which backend honours which option is
``backend_declaration``'s job.
"""

from __future__ import annotations

import math
import operator
import os
import types
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ...contracts import EM_AUDIT_POLICIES, AuditPolicy, choose
from ..registry import normalize_backend_name
from .em_pass.chunks import chunk_bounds
from .em_pass.runner_protocols import RunLedger
from .fitting.minibatch import check_minibatch_options

__all__ = [
    "HANDLE_OPTIONS",
    "EncodedDataOptions",
    "UnknownOptionError",
    "VerificationOptions",
    "declare_backend_options",
    "declared_options",
    "option_names",
    "split_keywords",
    "sub_chunked",
    "verification_names",
]

class UnknownOptionError(TypeError, ValueError):
    """A keyword that no options object of the call takes (both a ``TypeError``, as Python's own for an
    unexpected keyword, and a ``ValueError``, as every refused option)."""


HANDLE_OPTIONS = frozenset({"estimator", "model", "encoder", "num_chunks", "sub_chunks", "chunk_size", "precision"})
"""Options every ``ChunkedEncodedData`` handle honours, whatever runs its chunks."""


def _count(minimum: int) -> Any:
    """Validator: None or an exact int >= ``minimum`` (numpy integers too), naming the option."""

    def check(_: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not _is_int(value) or value < minimum:
            raise ValueError(f"{attribute.name} must be an int >= {minimum}, got {value!r}")

    return check


def _is_int(value: Any) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _int_or_none(value: Any) -> Any:
    """An integral value as a plain int (bools and non-integers are left for the validator to refuse)."""
    return int(value) if _is_int(value) and not isinstance(value, bool) else value


def _flag(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{attribute.name} must be True or False, got {type(value).__name__} {value!r}")


def _worker_count(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    """``num_workers``: None or an int; its range is the backend's (>= 1, or >= 0 DataLoader workers)."""
    if value is not None and (isinstance(value, bool) or not _is_int(value)):
        raise TypeError(f"num_workers must be an int or None, got {type(value).__name__} {value!r}")


def _minibatch(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    check_minibatch_options(**{attribute.name: value})  # mixle's error types and texts


def _resources(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not hasattr(value, "devices"):
        raise TypeError(f"resources= takes a Resources (its devices), got {type(value).__name__}")


def _read_only(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return types.MappingProxyType(dict(value or {}))


@attrs.frozen(kw_only=True, eq=False)
class EncodedDataOptions:
    """Every option of an encoded-data handle but the data and the backend name.

    The first twenty are mixle 0.8.2's ``encoded_data`` parameters (same names, defaults and
    meaning); ``chunk_size`` is ours; ``extra`` holds backend keywords (``timeout=``,
    ``start_method=``, ``direct_channel=``...), which the backend's declaration judges like the rest.
    The estimator, model and encoder are kept as given (a registered factory receives the very
    objects), and so is ``sub_chunks``: the handle applies it.
    """

    estimator: Any = None
    model: Any = None
    encoder: Any = None
    placement: Any = None
    resources: Any = attrs.field(default=None, validator=_resources)
    engine: Any = None
    precision: Any = None
    num_chunks: int | None = attrs.field(default=None, converter=_int_or_none, validator=_count(1))
    sub_chunks: int = attrs.field(default=1, converter=_int_or_none, validator=_count(1))
    num_workers: int | None = attrs.field(default=None, converter=_int_or_none, validator=_worker_count)
    client: Any = None
    comm: Any = None
    root: int = attrs.field(default=0, converter=_int_or_none, validator=_count(0))
    root_only: bool = attrs.field(default=False, validator=_flag)
    parallel_chunks: bool = attrs.field(default=False, validator=_flag)
    chunk_workers: int | None = attrs.field(default=None, converter=_int_or_none, validator=_count(1))
    batch_size: int | None = attrs.field(default=None, validator=_minibatch)
    shuffle: bool | None = attrs.field(default=None, validator=_minibatch)
    seed: int | None = attrs.field(default=None, validator=_minibatch)
    chunk_size: int | None = attrs.field(default=None, converter=_int_or_none, validator=_count(1))
    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=_read_only)
    """Engine keywords, checked against the backend's declaration like the fields above."""

    def __attrs_post_init__(self) -> None:
        if self.num_chunks is not None and self.chunk_size is not None:
            raise ValueError("give num_chunks or chunk_size, not both")
        clash = sorted(set(self.extra) & set(option_names()))
        if clash:
            raise ValueError(f"extra= holds {', '.join(clash)}, which are options of their own; pass them as such")

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each option's default (``extra`` left out)."""
        return {a.name: a.default for a in attrs.fields(cls) if a.name != "extra"}

    def set_options(self) -> dict[str, Any]:
        """The options given a value other than their default (``extra`` keywords included)."""
        out = {name: getattr(self, name) for name, default in self.defaults().items()
               if not _is_default(getattr(self, name), default)}
        out.update(self.extra)
        return out

    def as_kwargs(self) -> dict[str, Any]:
        """Every option as the keyword arguments of a backend factory (mixle's ``factory(data, **params)``)."""
        out = {name: getattr(self, name) for name in self.defaults()}
        out.update(self.extra)
        return out

    def replace(self, **changes: Any) -> EncodedDataOptions:
        """A copy with ``changes`` (validated again)."""
        return attrs.evolve(self, **changes)


def _is_default(value: Any, default: Any) -> bool:
    return value is default or (type(value) is type(default) and value == default)


def _rate(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0.0 <= value <= 1.0:
        raise ValueError(f"audit_rate must be a number in [0, 1] (the fraction of chunks recomputed per E-step), "
                         f"got {value!r}")


def _audit_flag(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"audit must be True, False or None (audit when more than one worker), got {value!r}")


def _seed(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not _is_int(value):
        raise ValueError(f"audit_seed must be an int (the seed of the audited chunks), got {value!r}")


def _ledger(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not isinstance(value, (RunLedger, str, os.PathLike)):
        raise TypeError(f"ledger= takes a verification.Ledger or a path, got {type(value).__name__}")


def _policy(value: Any) -> AuditPolicy:
    return choose(AuditPolicy, value, option="audit_policy", allowed=EM_AUDIT_POLICIES)  # type: ignore[return-value]


@attrs.frozen(kw_only=True, eq=False)
class VerificationOptions:
    """The verification controls of a handle: admission, SDC audit, ledger and fault injection.

    ``admission``: None (automatic), ``"unverified"``, a signed certificate or its path.
    ``audit``: None audits with two workers or more; ``audit_rate`` (default 0.05), ``audit_policy``
    (``quarantine``, ``raise`` or ``warn``) and ``audit_seed`` shape it. ``ledger``: a
    ``verification.Ledger`` or a path. ``fault_injector``: a ``FaultInjector`` of statistic bit flips
    that proves the audit, so it needs the audit on.
    """

    admission: Any = None
    audit: bool | None = attrs.field(default=None, validator=_audit_flag)
    audit_rate: float | None = attrs.field(default=None, validator=_rate)
    audit_policy: AuditPolicy = attrs.field(default=AuditPolicy.QUARANTINE, converter=_policy)
    audit_seed: int = attrs.field(default=0, validator=_seed)
    ledger: RunLedger | str | os.PathLike[str] | None = attrs.field(default=None, validator=_ledger)
    fault_injector: Any = None

    def __attrs_post_init__(self) -> None:
        if self.audit is False and self.fault_injector is not None:
            raise ValueError("fault_injector= flips bits for the SDC audit to find, but audit=False turns the audit "
                             "off; drop audit=False (or fault_injector=)")
        if self.audit is False and self.audit_rate is not None:
            raise ValueError("audit=False contradicts audit_rate=; drop one of them")

    def set_options(self) -> dict[str, Any]:
        """The controls given a value other than their default."""
        defaults = {a.name: a.default for a in attrs.fields(type(self))}
        return {name: getattr(self, name) for name, default in defaults.items()
                if not _is_default(getattr(self, name), default)}


_DECLARED: dict[str, frozenset[str]] = {}
"""Options added with :func:`declare_backend_options` (backend name -> options)."""


def declare_backend_options(backend: str, options: Iterable[str]) -> None:
    """Declare (add to) the options a backend honours, for a factory registered without ``options=``."""
    key = normalize_backend_name(backend)
    _DECLARED[key] = _DECLARED.get(key, frozenset()) | frozenset(options)


def declared_options(backend: str) -> frozenset[str] | None:
    """The options added for ``backend`` with :func:`declare_backend_options`, or None."""
    return _DECLARED.get(normalize_backend_name(backend))


def option_names() -> tuple[str, ...]:
    """The names of :class:`EncodedDataOptions` (``extra`` left out), in order."""
    return tuple(a.name for a in attrs.fields(EncodedDataOptions) if a.name != "extra")


def verification_names() -> tuple[str, ...]:
    """The names of :class:`VerificationOptions`, in order."""
    return tuple(a.name for a in attrs.fields(VerificationOptions))


def split_keywords(keywords: Mapping[str, Any], *, options: Any = None,
                   verification: Any = None) -> tuple[EncodedDataOptions, VerificationOptions]:
    """``(EncodedDataOptions, VerificationOptions)`` from keywords of both, plus the objects ``options=`` /
    ``verification=`` when given; any other keyword is a backend keyword (``extra``). One option given both
    as a keyword and in an object is refused."""
    if options is not None and not isinstance(options, EncodedDataOptions):
        raise TypeError(f"options= must be an EncodedDataOptions, got {type(options).__name__}")
    if verification is not None and not isinstance(verification, VerificationOptions):
        raise TypeError(f"verification= must be a VerificationOptions, got {type(verification).__name__}")
    handle_kw = {k: v for k, v in keywords.items() if k in option_names()}
    control_kw = {k: v for k, v in keywords.items() if k in verification_names()}
    extra = {k: v for k, v in keywords.items() if k not in handle_kw and k not in control_kw}
    given = EncodedDataOptions(**handle_kw, extra=extra)
    controls = VerificationOptions(**control_kw)
    return _merged(given, options), _merged_controls(controls, verification)


def _merged(given: EncodedDataOptions, options: EncodedDataOptions | None) -> EncodedDataOptions:
    if options is None:
        return given
    mine, theirs = given.set_options(), options.set_options()
    both = sorted(set(mine) & set(theirs))
    if both:
        raise ValueError(f"option(s) {', '.join(both)} given both as keywords and in options=; give each once")
    fields = {k: v for k, v in mine.items() if k not in given.extra}
    return options.replace(**fields, extra={**options.extra, **given.extra})


def _merged_controls(given: VerificationOptions, objects: VerificationOptions | None) -> VerificationOptions:
    if objects is None:
        return given
    both = sorted(set(given.set_options()) & set(objects.set_options()))
    if both:
        raise ValueError(f"control(s) {', '.join(both)} given both as keywords and in verification=; give each once")
    return attrs.evolve(objects, **given.set_options())


def sub_chunked(num_rows: int | None, num_chunks: int | None, chunk_size: int | None,
                sub_chunks: int) -> tuple[int | None, int | None]:
    """``(num_chunks, chunk_size)`` with every chunk cut into ``sub_chunks`` pieces (mixle's meaning)."""
    if sub_chunks == 1:
        return num_chunks, chunk_size
    if num_chunks is not None:
        return num_chunks * sub_chunks, None
    if chunk_size is not None:
        return None, max(1, math.ceil(chunk_size / sub_chunks))
    if num_rows is None:
        return None, None
    return len(chunk_bounds(num_rows)) * sub_chunks, None
