"""mixle 0.8.2's decomposition contract translated into ours, for real ``mixle.stats`` models.

A mixle distribution's ``decomposition()`` returns mixle's own ``Decomposition`` (axis, num_units,
reduction, child_roles, shared_children, ...) but no children and no parameters. The children split
along the axis are found where mixle's planner finds them (``components`` for a component axis,
``dists`` for factors, ``topics`` for topics and HMM states, ``dist`` for a sequence); the other
nested models and the node's own numeric parameters come from a declared table of mixle's families
(:data:`MIXLE_FAMILIES`, extended with :func:`register_mixle_family`). Nothing walks ``__dict__``;
mixle is never imported here (a family is known by its class name under the ``mixle.`` package).
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["MIXLE_FAMILIES", "MixleFamily", "MixleNodeView", "is_mixle_decomposition", "register_mixle_family",
           "view_mixle_node"]

# where mixle's planner looks for the children split along each axis (first attribute present wins)
_AXIS_CHILDREN: dict[str, tuple[str, ...]] = {
    "component": ("components",), "factor": ("dists",), "topic": ("topics",),
    "state": ("topics", "components"), "sequence": ("dist",),
}


@attrs.frozen
class MixleFamily:
    """What a mixle family holds: attributes with nested models (``children``) and its own numeric ``params``."""

    children: tuple[str, ...] = ()
    params: tuple[str, ...] = ()


MIXLE_FAMILIES: dict[str, MixleFamily] = {
    "MixtureDistribution": MixleFamily(("components",), ("w", "log_w")),
    "HeterogeneousMixtureDistribution": MixleFamily(("components",), ("w", "log_w")),
    "HiddenMarkovModelDistribution": MixleFamily(("topics", "len_dist"),
                                                 ("w", "log_w", "transitions", "log_transitions")),
    "CompositeDistribution": MixleFamily(("dists",)),
    "OptionalDistribution": MixleFamily(("dist",), ("p",)),
    "SequenceDistribution": MixleFamily(("dist", "len_dist")),
    "GaussianDistribution": MixleFamily((), ("mu", "sigma2")),
    "MultivariateGaussianDistribution": MixleFamily((), ("mu", "covar")),
    "DiagonalGaussianDistribution": MixleFamily((), ("mu", "covar")),
    "CategoricalDistribution": MixleFamily((), ("pmap",)),
    "PoissonDistribution": MixleFamily((), ("lam",)),
    "ExponentialDistribution": MixleFamily((), ("beta",)),
    "GammaDistribution": MixleFamily((), ("k", "theta")),
    "BernoulliDistribution": MixleFamily((), ("p",)),
}


def register_mixle_family(class_name: str, *, children: tuple[str, ...] = (), params: tuple[str, ...] = ()) -> None:
    """Declare the nested-model and parameter attributes of a mixle family this table does not list."""
    if not isinstance(class_name, str) or not class_name.isidentifier():
        raise ValueError(f"register_mixle_family: class_name must be a class name, got {class_name!r}")
    for label, names in (("children", children), ("params", params)):
        if not isinstance(names, tuple) or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise ValueError(f"register_mixle_family: {label} must be a tuple of attribute names, got {names!r}")
    MIXLE_FAMILIES[class_name] = MixleFamily(children, params)


def is_mixle_decomposition(found: Any) -> bool:
    """Whether ``found`` has the shape of mixle's ``Decomposition`` (axis and reduction enums, num_units)."""
    return all(hasattr(found, name) for name in ("axis", "reduction", "num_units", "child_roles")) \
        and isinstance(getattr(found.axis, "value", None), str) \
        and isinstance(getattr(found.reduction, "value", None), str)


def _family(node: Any) -> MixleFamily | None:
    for cls in type(node).__mro__:
        if cls.__module__.split(".")[0] == "mixle" and cls.__name__ in MIXLE_FAMILIES:
            return MIXLE_FAMILIES[cls.__name__]
    return None


def _nested(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(v for v in value if v is not None)
    return (value,)


def _axis_units(node: Any, axis: str) -> tuple[Any, ...]:
    for name in _AXIS_CHILDREN.get(axis, ()):
        found = _nested(getattr(node, name, None))
        if found:
            return found
    return ()


@attrs.frozen
class MixleNodeView:
    """A mixle node as our decomposition sees it: axis and reduction values, split ``units`` with ``roles``,
    other ``owned`` nested models, and its own ``params``."""

    axis: str
    reduction: str
    units: tuple[Any, ...]
    roles: tuple[str, ...]
    owned: tuple[Any, ...]
    params: tuple[Any, ...]


def view_mixle_node(node: Any, found: Any) -> MixleNodeView:
    """The children and parameters of ``node`` under the mixle-shaped descriptor ``found`` it declared."""
    axis, reduction = str(found.axis.value), str(found.reduction.value)
    if axis != "none" and axis not in _AXIS_CHILDREN:
        raise TypeError(f"{type(node).__name__}.decomposition() declares the axis {axis!r}; the axes understood are "
                        f"{['none', *_AXIS_CHILDREN]}")
    family = _family(node)
    children: list[Any] = []
    for name in family.children if family is not None else ():
        children.extend(_nested(getattr(node, name, None)))
    units = _axis_units(node, axis) if axis != "none" else ()
    if len(units) != int(found.num_units):  # mixle's planner does not split a node whose children do not match
        units, axis, reduction = (), "none", "replicate"
    owned = tuple(c for c in children if not any(c is u for u in units))
    roles = tuple(str(r) for r in found.child_roles) if units and len(found.child_roles) == len(units) else ()
    params = tuple(getattr(node, name) for name in (family.params if family is not None else ())
                   if getattr(node, name, None) is not None)
    return MixleNodeView(axis, reduction, units, roles, owned, params)
