"""The options of a training ``prepare()`` as frozen objects, validated at the edge, and who honours each.

``TrainOptions`` holds every option a training backend's ``prepare(module, *, plan, **options)``
takes (mixle's documented signature: the keywords are turned into this object at once, by
:meth:`TrainOptions.from_keywords`); ``AuditOptions`` is the in-session SDC audit's part (the
``audit*`` and ``fault_injector`` keywords) and ``HealthOptions`` the health receipts' part. Each field
declares the backends that honour it: a keyword no backend knows is refused with ``TypeError``
naming it; a keyword this backend does not honour is refused with ``ValueError`` naming the option,
the backend and the backends that do. Nothing here imports torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import attrs

from ..contracts import TRAINING_AUDIT_POLICIES, AuditPolicy, choose
from ..verification.health import ModelFlopConfig
from ..verification.ledger import Ledger
from ..verification.sdc.schedule import TRAINING_AUDIT_RATE

__all__ = [
    "AUDIT_KEYWORDS", "MEGATRON", "MEGATRON_BRIDGE", "TORCH_NATIVE", "AuditMode", "AuditOptions", "AuditReplay",
    "HealthOptions", "NonfinitePolicy", "TrainOptions", "UnhonouredOptionError", "honouring_backends",
    "refuse_unhonoured", "train_keywords",
]

TORCH_NATIVE, MEGATRON, MEGATRON_BRIDGE = "torch_native", "megatron", "megatron_bridge"
_TORCH, _MEGATRON, _BRIDGE = (TORCH_NATIVE,), (MEGATRON,), (MEGATRON_BRIDGE,)
_NATIVE = (TORCH_NATIVE, MEGATRON)  # the backends that run the step themselves
FAILURE_POLICIES = ("exit", "raise", "warn")
"""What a rank does when the heartbeat finds a dead or hung peer."""


class UnhonouredOptionError(ValueError, TypeError):
    """A training option this backend does not honour (another does: the message names it). Both a
    ``ValueError`` and a ``TypeError``: mixle 0.8.2 raised ``TypeError`` for any option it did not take."""


class AuditMode(StrEnum):
    """Whether a session audits its steps: ``prepare(audit=None | True | False)``."""

    AUTO = "auto"
    """On where the plan supports it (``audit=None``, the default)."""
    ON = "on"
    """Required: a plan the audit cannot replay is refused (``audit=True``)."""
    OFF = "off"
    """No audit (``audit=False``)."""


class AuditReplay(StrEnum):
    """Who recomputes an audited step's local gradient (``audit_replay=``)."""

    PEER = "peer"
    """The next rank of the data-parallel group; the same rank too when a peer disagreed or none exists."""
    BOTH = "both"
    """A peer and the same rank on every audited step."""


class NonfinitePolicy(StrEnum):
    """What a commit does with a non-finite loss or gradient (``nonfinite=``); nothing is committed either way."""

    RAISE = "raise"
    """Raise ``FloatingPointError`` on every rank."""
    SKIP = "skip"
    """Return a skipped receipt and go on."""


def _number(value: Any, option: str, *, low: float, low_ok: bool, high: float = math.inf) -> float:
    """``value`` as a float; refuses bools, non-numbers, NaN and values outside (low | [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{option} must be a number, got {type(value).__name__} ({value!r})")
    number = float(value)
    if not ((number >= low if low_ok else number > low) and number <= high):
        where = (f"within {'[' if low_ok else '('}{low:g}, {high:g}]" if high < math.inf
                 else f"{'>=' if low_ok else '>'} {low:g}")
        raise ValueError(f"{option}={value!r} must be {where}")
    return number


def _audit_rate(value: Any) -> float:
    return _number(value, "audit_rate", low=0.0, low_ok=True, high=1.0)


def _audit_bound(value: Any) -> float:
    return _number(value, "audit_bound", low=0.0, low_ok=True)


def _lr(value: Any) -> float:
    return _number(value, "lr", low=0.0, low_ok=False)


def _max_grad_norm(value: Any) -> float | None:
    return None if value is None else _number(value, "max_grad_norm", low=0.0, low_ok=False)


def _weight_decay(value: Any) -> float:
    return _number(value, "weight_decay", low=0.0, low_ok=True)


def _sgd_momentum(value: Any) -> float:
    return _number(value, "sgd_momentum", low=0.0, low_ok=True)


def _policy(value: Any) -> AuditPolicy:
    return AuditPolicy(choose(AuditPolicy, value, option="audit_policy", allowed=TRAINING_AUDIT_POLICIES))


def _replay(value: Any) -> AuditReplay:
    return AuditReplay(choose(AuditReplay, value, option="audit_replay"))


def _nonfinite(value: Any) -> NonfinitePolicy:
    return NonfinitePolicy(choose(NonfinitePolicy, value, option="nonfinite"))


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"seed must be an int >= 0 or None, got {value!r}")
    return int(value)


def _exact_bool(option: str) -> Callable[[Any, Any, Any], None]:
    def check(_: Any, __: Any, value: Any) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"{option} must be True or False, got {type(value).__name__} {value!r}")
    return check


def _callable(option: str) -> Callable[[Any, Any, Any], None]:
    def check(_: Any, __: Any, value: Any) -> None:
        if value is not None and not callable(value):
            raise TypeError(f"{option} must be callable or None, got {type(value).__name__}")
    return check


def _mapping(value: Any, option: str) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{option} must be a mapping or None, got {type(value).__name__}")
    return MappingProxyType(dict(value))


def _tp_plan(value: Any) -> Mapping[str, Any] | None:
    return _mapping(value, "tp_plan")


def _moe_config(value: Any) -> Mapping[str, Any] | None:
    return _mapping(value, "moe_config")


def _ints(value: Any, option: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{option} must be a sequence of ints or None, got {type(value).__name__}")
    items = tuple(value)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items):
        raise ValueError(f"{option}={list(items)!r} must hold ints >= 0")
    return items


def _activation_shape(value: Any) -> tuple[int, ...] | None:
    return _ints(value, "activation_shape")


def _stage_boundaries(value: Any) -> tuple[int, ...] | None:
    return _ints(value, "stage_boundaries")


def _precision(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"precision must be a string such as 'fp32' or 'bf16', got {type(value).__name__}")
    return value.strip().lower()


def _audit_mode(value: Any) -> AuditMode:
    """``audit=``: None (on where supported), True (required), False (off), or an ``AuditMode``."""
    if value is None or value is True or value is False:
        return {None: AuditMode.AUTO, True: AuditMode.ON, False: AuditMode.OFF}[value]
    if isinstance(value, (AuditMode, str)):
        return AuditMode(choose(AuditMode, value, option="audit"))
    raise ValueError(f"audit must be None (on where supported), True or False, got {value!r}")


def _fault_injector(_: Any, __: Any, value: Any) -> None:
    if value is not None and not (hasattr(value, "apply") and hasattr(value, "pending")):
        raise TypeError(f"fault_injector must be a verification.FaultInjector or None, got {type(value).__name__}")


@attrs.frozen(kw_only=True)
class AuditOptions:
    """The in-session SDC audit of a torch_native session (the ``audit*`` and ``fault_injector`` keywords).

    At ``rate`` (plus the run's first step) a step's local gradient is recomputed by a peer of its
    data-parallel group (and on the same rank when a peer disagreed or none exists; ``replay=BOTH``:
    on every audited step) before ``optimizer.step()``; ``policy`` says what a mismatch does and
    ``bound`` is the allowed max abs difference (0 = bitwise). ``fault_injector`` strikes planned bit
    flips into gradients and parameters whether the audit is on or off (to show what it catches).
    """

    mode: AuditMode = attrs.field(default=AuditMode.AUTO, converter=_audit_mode)
    rate: float = attrs.field(default=TRAINING_AUDIT_RATE, converter=_audit_rate)
    policy: AuditPolicy = attrs.field(default=AuditPolicy.RAISE_DEFECTS, converter=_policy)
    bound: float = attrs.field(default=0.0, converter=_audit_bound)
    replay: AuditReplay = attrs.field(default=AuditReplay.PEER, converter=_replay)
    fault_injector: Any = attrs.field(default=None, validator=_fault_injector)

    def __attrs_post_init__(self) -> None:
        if self.mode is AuditMode.OFF:
            refuse_settings_without_audit([keyword for keyword, name in AUDIT_KEYWORDS.items()
                                           if name in _SETTINGS and getattr(self, name) != _DEFAULTS[name]])


def refuse_settings_without_audit(given: Iterable[str]) -> None:
    """``audit=False`` with an audit setting (``audit_rate``, ``audit_policy``, ``audit_bound``, ``audit_replay``)
    is a contradiction, refused by name as EM's handle refuses it (``fault_injector`` stays: it shows what an
    unaudited run lets through)."""
    named = sorted(given)
    if named:
        raise ValueError(f"audit=False turns the SDC audit off, which contradicts {', '.join(f'{n}=' for n in named)}"
                         "; drop audit=False or the audit setting(s)")


AUDIT_KEYWORDS: Mapping[str, str] = MappingProxyType({
    "audit": "mode", "audit_rate": "rate", "audit_policy": "policy", "audit_bound": "bound",
    "audit_replay": "replay", "fault_injector": "fault_injector"})
"""``prepare()`` keyword -> ``AuditOptions`` field."""

_SETTINGS = ("rate", "policy", "bound", "replay")
"""The ``AuditOptions`` fields that only mean something with the audit on."""
_DEFAULTS = {a.name: a.default for a in attrs.fields(AuditOptions)}


@attrs.frozen(kw_only=True)
class HealthOptions:
    """Health settings of a session: the monitor's thresholds, the FLOP model and peak, the heartbeat."""

    flop_config: ModelFlopConfig | None = None
    peak_flops_per_sec: float | None = None  # per device; None: a measured matmul peak
    loss_z_thresh: float = 6.0
    grad_z_thresh: float = 6.0
    window: int = 20
    min_periods: int = 5
    straggler_ratio: float = 1.5
    straggler_min_s: float = 0.005
    straggler_steps: int = 3  # a rank must be the slow one on this many steps in a row to be a straggler
    heartbeat: bool = True
    heartbeat_interval_s: float = 0.5
    dead_after_s: float = 30.0
    hung_after_s: float = 300.0
    on_failure: str = attrs.field(default="exit", validator=attrs.validators.in_(FAILURE_POLICIES))
    incident_dir: str | None = None  # each rank writes incident-rank<R>.json there before it exits


def resolve_health(health: Any) -> HealthOptions | None:
    """``prepare(health=)``: None/True = defaults, False = off, a HealthOptions, or a dict of its fields."""
    if health is False:
        return None
    if health is None or health is True:
        return HealthOptions()
    if isinstance(health, HealthOptions):
        return health
    if isinstance(health, Mapping):
        unknown = set(health) - {f.name for f in attrs.fields(HealthOptions)}
        if unknown:
            raise ValueError(f"unknown health options {sorted(unknown)}; see HealthOptions")
        return HealthOptions(**health)
    raise TypeError(f"health must be None, a bool, a HealthOptions or a dict, got {type(health).__name__}")


def _ledger(value: Any) -> Ledger | str | os.PathLike[str] | None:
    if value is None or isinstance(value, Ledger):
        return value
    if isinstance(value, (str, os.PathLike)):
        if not str(value).strip():
            raise ValueError("ledger must be a non-empty path, a verification.Ledger or None")
        return value
    raise TypeError(f"ledger must be a path, a verification.Ledger or None, got {type(value).__name__}")


def _field(default: Any, backends: tuple[str, ...], **kwargs: Any) -> Any:
    return attrs.field(default=default, metadata={"backends": backends}, **kwargs)


@attrs.frozen(kw_only=True)
class TrainOptions:
    """Every option of a training ``prepare()``; each field's metadata names the backends that honour it.

    ``None`` means the backend's default where backends differ (``optimizer``: AdamW on torch_native,
    ``"adam"`` on megatron; ``precision``: fp32, bf16 on megatron_bridge; ``seed``: torch_native leaves
    the RNG alone, megatron seeds 0 before calling a model builder). See docs/training.md and
    docs/megatron.md for what each does.
    """

    loss_fn: Callable[..., Any] | None = _field(None, _NATIVE, validator=_callable("loss_fn"))
    optimizer: Any = _field(None, _NATIVE + _BRIDGE)
    lr: float = _field(1e-3, _NATIVE, converter=_lr)
    scheduler: Callable[[Any], Any] | None = _field(None, _TORCH, validator=_callable("scheduler"))
    max_grad_norm: float | None = _field(None, _NATIVE, converter=_max_grad_norm)
    precision: str | None = _field(None, _NATIVE + _BRIDGE, converter=_precision)
    device: Any = _field(None, _NATIVE)
    seed: int | None = _field(None, _NATIVE, converter=_seed)
    admission: Any = _field(None, _NATIVE + _BRIDGE)
    certificate: Any = _field(None, _NATIVE + _BRIDGE)
    health: HealthOptions | None = _field(HealthOptions(), _NATIVE, converter=resolve_health)
    tp_plan: Mapping[str, Any] | None = _field(None, _TORCH, converter=_tp_plan)
    find_unused_parameters: bool = _field(False, _TORCH, validator=_exact_bool("find_unused_parameters"))
    nonfinite: NonfinitePolicy = _field(NonfinitePolicy.RAISE, _TORCH, converter=_nonfinite)
    audit: AuditOptions = _field(AuditOptions(), _TORCH)
    ledger: Any = _field(None, _TORCH, converter=_ledger)
    activation_shape: tuple[int, ...] | None = _field(None, _MEGATRON, converter=_activation_shape)
    stage_boundaries: tuple[int, ...] | None = _field(None, _MEGATRON, converter=_stage_boundaries)
    moe_config: Mapping[str, Any] | None = _field(None, _MEGATRON, converter=_moe_config)
    weight_decay: float = _field(0.0, _MEGATRON, converter=_weight_decay)
    sgd_momentum: float = _field(0.9, _MEGATRON, converter=_sgd_momentum)
    ddp_config: Any = _field(None, _BRIDGE)
    wrap_with_ddp: bool = _field(True, _BRIDGE, converter=bool)
    train_batch_fn: Callable[..., Any] | None = _field(None, _BRIDGE, validator=_callable("train_batch_fn"))

    @classmethod
    def from_keywords(cls, backend: str, keywords: Mapping[str, Any]) -> TrainOptions:
        """The options of ``prepare(module, plan=..., **keywords)`` on ``backend``, refused as the module says."""
        refuse_unhonoured(backend, keywords, f"{backend} prepare()")
        audit_given = {AUDIT_KEYWORDS[k]: v for k, v in keywords.items() if k in AUDIT_KEYWORDS}
        plain = {k: v for k, v in keywords.items() if k not in AUDIT_KEYWORDS}
        if keywords.get("audit") is False or keywords.get("audit") == AuditMode.OFF:
            refuse_settings_without_audit(k for k in keywords if AUDIT_KEYWORDS.get(k) in _SETTINGS)
        if isinstance(keywords.get("audit"), AuditOptions):
            if len(audit_given) > 1:
                raise ValueError("pass the audit as audit=AuditOptions(...) or as audit_* keywords, not both")
            return cls(**plain, audit=keywords["audit"])
        return cls(**plain, audit=AuditOptions(**audit_given)) if audit_given else cls(**plain)


def train_keywords() -> dict[str, tuple[str, ...]]:
    """Every ``prepare()`` keyword -> the backends that honour it (built from the fields, so none escapes)."""
    out = {f.name: tuple(f.metadata["backends"]) for f in attrs.fields(TrainOptions) if f.name != "audit"}
    audit_backends = tuple(attrs.fields(TrainOptions).audit.metadata["backends"])
    out.update(dict.fromkeys(AUDIT_KEYWORDS, audit_backends))
    return out


def honouring_backends(option: str) -> tuple[str, ...]:
    """The backends that honour the ``prepare()`` keyword ``option`` (empty for an unknown one)."""
    return train_keywords().get(option, ())


def refuse_unhonoured(backend: str, keywords: Iterable[str], where: str) -> None:
    """Raise for a keyword no training backend knows (``TypeError``) or one ``backend`` does not honour
    (``UnhonouredOptionError`` naming the option, the backend and the backends that honour it)."""
    known = train_keywords()
    unknown = sorted(k for k in keywords if k not in known)
    if unknown:
        raise TypeError(f"{where} got unknown option(s) {', '.join(unknown)}; the training options are "
                        f"{', '.join(sorted(known))} (see TrainOptions)")
    for key in keywords:
        if backend not in known[key]:
            raise UnhonouredOptionError(f"option {key}= is not honoured by the {backend!r} backend; it is honoured by "
                             f"{', '.join(repr(b) for b in known[key])}. Leave it out here, or train with "
                             f"a backend that honours it")
