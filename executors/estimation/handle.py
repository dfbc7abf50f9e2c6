"""The one generic encoded-data handle every EM backend shares: any chunk runner becomes a handle.

:class:`ChunkedEncodedData` runs the E-step, initialization and log-density passes over a
:class:`~mixle_parallel.executors.estimation.em_pass.chunks.ChunkRunner`, combines statistics in the fixed
two-level order, and wires in the SDC audit and the ledger. :func:`handle_from_runner` is how an
engine backend builds one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...contracts.estimation import statistic_digest
from ...contracts.placement import Placement
from .audit.sdc_audit import EMAudit
from .compat.mixle_interop import adapt_mixle_objects
from .compat.mixle_sequence import MixleSequenceMethods
from .em_pass.chunks import (
    ChunkResult,
    ChunkRunner,
    EStepResult,
    GroupFold,
    chunk_bounds,
    chunk_estep,
    chunk_log_density,
    count_rows,
    encode_chunks,
    fold_pass,
    resolve_encoder,
)
from .em_pass.deferred_judging import DeferredPasses
from .em_pass.engine_choice import EngineChoice, resolve_engine
from .em_pass.estep import (
    audited_entries,
    folded_result,
    record_receipt,
    write_findings,
)
from .em_pass.runner_protocols import AssignsChunks, RunLedger, transport_count
from .em_pass.verification_binding import VerifiedPasses
from .fitting.minibatch import MinibatchSpec, minibatch_spec
from .fitting.minibatch_passes import MinibatchPasses
from .observability.em_observability import (
    FitReport,
    RankRecord,
    fit_report,
    json_ready_report,
    round_summary,
)
from .observability.metering import MeteredRunner
from .options import EncodedDataOptions, UnknownOptionError, option_names, sub_chunked
from .planning.placement_check import check_placement
from .planning.planner import placement_for_bounds
from .sources import ChunkPlace, OpenedSource, as_source, open_source, source_layout, source_places

__all__ = ["STRAGGLER_MIN_EXCESS_S", "ChunkedEncodedData", "handle_from_runner"]

STRAGGLER_MIN_EXCESS_S = 0.05
"""A worker is named a straggler in the receipts only when it is this many seconds slower than the
others' median (besides the ratio and robust-z rule), so scheduling jitter on tiny passes is not news."""


class ChunkedEncodedData(MixleSequenceMethods, MinibatchPasses, VerifiedPasses, DeferredPasses):
    """An encoded-data handle over any :class:`ChunkRunner`; same bits on every backend.

    Its mixle 0.8.2 sequence methods (``compat.mixle_sequence``), mini-batch passes and stochastic EM
    (``fitting.minibatch_passes``) and its admission/audit/ledger binding (``em_pass.verification_binding``)
    are bases of their own; this class holds the data, options and runner and runs the passes."""

    def __init__(self, runner: ChunkRunner, data: Any = None, options: EncodedDataOptions | None = None, *,
                 num_rows: int | None = None, owns_runner: bool = True, **params: Any) -> None:
        """A handle over ``runner`` for ``data`` (None on a rank that holds no rows: give ``num_rows``).

        ``options`` (an :class:`EncodedDataOptions`) and/or ``params`` (its fields as keywords) are the
        handle's: the estimator/model/encoder (mixle objects adapted here), the chunking
        (``num_chunks``/``chunk_size``, every chunk cut into ``sub_chunks``; with ``batch_size``/
        ``shuffle``/``seed`` and no chunking a mini-batch is one chunk), the ``placement`` or
        ``resources`` the chunks follow, and the compute engine.
        """
        opts = handle_options(options, params, where=type(self).__name__)
        self.options = opts
        """The options this handle was built with (what a reuse with conflicting controls is refused against)."""
        self.runner = runner
        estimator, model, encoder = adapt_mixle_objects(opts.estimator, opts.model, opts.encoder)
        self.engine: EngineChoice | None = _engine_of(opts.engine, opts.precision, estimator, model)
        """The compute engine of the E-step (``engine="torch"``), or None for the numpy engine."""
        self._metered = MeteredRunner(runner)  # every pass measured per worker (em_observability)
        self.rank_records: list[RankRecord] = []
        self.last_transport_messages: int | None = None
        """Messages the runner handed to and took from its transport in the last E-step (None: it does not count)."""
        """One ``RankRecord`` per worker and E-step (round = iteration), emitted by the workers themselves."""
        self._data = data
        source = as_source(data)
        self._audit_rows = data if source is None else None  # kept (not copied) for the SDC audit's reference
        self.source: OpenedSource | None = None if source is None else open_source(source, runner)
        """The source the rows are read from where they live (``files``, an RDD...), or None for rows in memory."""
        part_rows = None if self.source is None else self.source.part_rows
        self.num_rows = (sum(part_rows) if part_rows is not None else
                         count_rows(data) if num_rows is None else int(num_rows))
        self.bounds, self.minibatch, placement = handle_layout(opts, self.num_rows, part_rows)
        """The chunks' row ranges; the ``MinibatchSpec`` of stochastic EM (``batch_size=, shuffle=, seed=``)."""
        self.places: tuple[ChunkPlace, ...] | None = None if part_rows is None else source_places(self.bounds,
                                                                                                   part_rows)
        """Each chunk's (part, row offset) in the source, or None for rows in memory."""
        if placement is None and opts.resources is not None:  # rows to workers by the devices' throughput
            placement = _resource_placement(self.bounds, data, opts.resources, estimator, model, encoder)
        self.placement = check_placement(placement, self.num_rows, self.bounds, runner)
        """The planner's ``Placement`` the chunks follow (rows to workers by its shards), or None."""
        self.last_stochastic_fit: Any = None
        """The ``StochasticFit`` (model, steps, passes) of the last ``stochastic_em`` call."""
        self._owns_runner = owns_runner
        self._scattered = False
        self._closed = False
        self._encoder = encoder if encoder is not None else (
            resolve_encoder(estimator, model) if (estimator is not None or model is not None) else None
        )
        self.admission: Any = None
        """The ``AdmissionDecision`` that let this handle run (set by ``encoded_data``)."""
        self.ledger: RunLedger | None = None
        self.iteration = 0
        """E-steps done so far (the step number of the next ledger receipt and audit)."""
        self.last_audits: tuple[Any, ...] = ()
        self.last_receipt: Any = None
        """The StepReceipt of the last E-step (also written to the ledger when there is one)."""
        self._audit: EMAudit | None = None
        self._fit_first = True
        self._failure: str | None = None
        if self._encoder is not None:
            self._ensure_scattered(None, None)

    # -- identity -------------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """Name of the runner's backend."""
        return self.runner.name

    @property
    def num_workers(self) -> int:
        """Workers of the runner."""
        return self.runner.num_workers

    @property
    def num_chunks(self) -> int:
        """Chunks the data is cut into."""
        return len(self.bounds)

    def __len__(self) -> int:
        """Rows of the data (mixle's ``len(handle)``)."""
        return self.num_rows

    def __repr__(self) -> str:
        return (f"ChunkedEncodedData(backend={self.backend!r}, rows={self.num_rows}, "
                f"chunks={self.num_chunks}, workers={self.num_workers})")

    # -- placement ------------------------------------------------------------------------------
    def _ensure_scattered(self, estimator: Any, model: Any) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed; create a new handle with encoded_data(...)")
        if self._scattered:
            return
        if self._encoder is None:
            self._encoder = resolve_encoder(estimator, model)
        if self.source is not None:
            assert self.places is not None  # set with the source
            self.source.place(self.runner, self.places, self._encoder)  # built where the rows live
        elif self._data is None:
            raise ValueError("this handle has no data to encode; pass the rows to encoded_data()")
        else:
            self.runner.scatter(encode_chunks(self._data, self._encoder, self.bounds))
        if self.placement is not None:
            blocks = [range(s.first_chunk, s.last_chunk) for s in self.placement.shards]
            assert isinstance(self.runner, AssignsChunks)  # checked by check_placement
            self.runner.assign_chunks(blocks)
        self._scattered = True
        self._data = None  # the runner holds the encoded chunks now

    def _map(self, fn: Callable[[Any, Any], Any], payload: Any, estimator: Any = None, model: Any = None) -> list[Any]:
        self._ensure_scattered(estimator, model)
        if self._audit is not None and self._audit.excluded:  # keep quarantined / lost workers idle
            try:
                results = self._audit.placed_map(fn, payload, self.num_chunks)
            finally:
                write_findings(self.ledger, self._audit.take_events())
        else:
            results = self._metered.map_chunks(fn, payload)
        if len(results) != self.num_chunks:
            raise RuntimeError(
                f"backend {self.backend!r} returned {len(results)} chunk results for {self.num_chunks} "
                "chunks; a runner must return one result per chunk, ordered by chunk id"
            )
        return results

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any, estimator: Any = None) -> list[Any]:
        """``fn(chunk, payload)`` on every resident chunk (encoded for ``estimator`` first), in chunk order."""
        return self._map(fn, payload, estimator)

    def _bound(self, estimator: Any, model: Any) -> tuple[Any, Any]:
        """``(estimator, model)`` bound to the handle's compute engine (unchanged for the numpy engine)."""
        if self.engine is None:
            return estimator, model
        from .em_pass.torch_engine import bind

        return bind(estimator, model, self.engine)

    # -- EM ---------------------------------------------------------------------------------------
    def chunk_statistics(self, estimator: Any, model: Any) -> list[ChunkResult]:
        """Per-chunk E-step results in chunk order (for audits: compare with ``statistic_digest``)."""
        estimator, model = self._bound(estimator, model)
        return [ChunkResult(*r) for r in self._map(chunk_estep, (estimator, model), estimator, model)]

    def estep_entries(self, estimator: Any, model: Any, raw: Sequence[int] = (), *, commit: bool = False,
                      retain: str = "") -> list[Any]:
        """One pass's E-step entries for :func:`fold_pass`: groups folded on the workers where the runner
        can, per chunk otherwise; the ``raw`` chunks' own results come back too (see ``chunk_result``), and
        with ``commit`` the digests of every chunk's own result (see ``committed_result``); with ``retain`` the
        workers keep their folded groups' own results for a ``GroupReveal`` (the audit opens groups)."""
        estimator, model = self._bound(estimator, model)
        fold = GroupFold(chunk_estep, self.num_chunks, frozenset(int(c) for c in raw), commit, retain)
        # GroupFold is callable through its __call__, which mypy does not see on a NamedTuple
        return self._map(fold, (estimator, model), estimator, model)  # type: ignore[arg-type]  # NamedTuple __call__

    def _log_densities(self, estimate: Any) -> list[Any]:
        """Each chunk's ``(rows, log-likelihood)`` under ``estimate`` (already bound to the engine), in chunk order:
        the scoring pass of mixle's ``pysp_seq_log_density_sum`` (``compat.mixle_sequence``)."""
        return self._map(chunk_log_density, estimate, None, estimate)

    def chunk_digests(self, estimator: Any, model: Any) -> list[str]:
        """``sha256:`` digest of each chunk's statistics, in chunk order."""
        return [statistic_digest(r.stats) for r in self.chunk_statistics(estimator, model)]

    def estep(self, estimator: Any, model: Any) -> EStepResult:
        """One data pass: the statistics under ``model``, its log-likelihood, and the M-step.

        Audited (``audit.sdc_audit``; the pass is ``em_pass.estep``) when the handle has an SDC audit; each pass
        is one ledger receipt when the handle has a ledger.
        """
        estimator, model, _ = adapt_mixle_objects(estimator, model, None)
        estimator, model = self._bound(estimator, model)
        iteration = self.iteration
        moved_before, messages_before = (transport_count(self.runner, "transport_bytes"),
                                         transport_count(self.runner, "transport_messages"))
        self._metered.begin(iteration, "estep")
        outcomes: tuple[Any, ...] = ()
        held = None  # a pass that waits to be judged with the fit's batch (``deferred_judging``)
        try:
            if self._audit is not None:
                self._ensure_scattered(estimator, model)
                if self._deferred is not None and self._deferred.may_defer(estimator, iteration):
                    held = self._commit_held(estimator, model, iteration)
                    entries = held[0].entries
                else:
                    entries, outcomes = audited_entries(
                        self._audit, self.ledger, estimator, model, iteration=iteration,
                        num_chunks=self.num_chunks, encoder=self._encoder, first_of_fit=self._fit_first)
            else:
                entries = self.estep_entries(estimator, model)
        finally:
            records = self._metered.end()
            self.rank_records.extend(records)
            after = transport_count(self.runner, "transport_messages")
            self.last_transport_messages = None if after is None or messages_before is None else after - messages_before
        self._fit_first = False
        out = folded_result(estimator, entries, self._fold_entries)
        self.iteration = iteration + 1
        fields = {"workers": self.num_workers, "observability": round_summary(records,
                                                                             min_excess_seconds=STRAGGLER_MIN_EXCESS_S),
                  "transport_bytes": None if moved_before is None else
                  int(transport_count(self.runner, "transport_bytes") or 0) - moved_before,
                  "draw": None if self._audit is None or self._audit.last_draw is None else
                  self._audit.last_draw.receipt_fields()}
        if held is not None and self._deferred is not None:  # its receipt is written once it is judged
            self._deferred.hold(held[0], out, fields, held[1], held[2])
            self.last_audits, self.last_receipt = (), None
            return out
        self.last_audits = tuple(outcomes)
        self.last_receipt = record_receipt(self.ledger, iteration, out, admission=self.admission, outcomes=outcomes,
                                           quarantined=sorted(self.quarantined), **fields)
        return out

    def _fold_entries(self, estimator: Any, entries: list[Any]) -> Any:
        """A pass's total from its entries (``fold_pass``); a subclass may guard it (``finite_guarded_fold``)."""
        return fold_pass(estimator, entries)

    # -- observability ----------------------------------------------------------------------------
    @property
    def last_rank_records(self) -> tuple[RankRecord, ...]:
        """The ``RankRecord``s of the last E-step."""
        return tuple(r for r in self.rank_records if r.round == self.iteration - 1)

    def fit_report(self, *, threshold_ratio: float = 1.5, z_threshold: float = 3.0,
                   min_excess_seconds: float = STRAGGLER_MIN_EXCESS_S) -> FitReport:
        """Stragglers, data skew and totals over every E-step of this handle (``em_observability``)."""
        return fit_report(self.rank_records, threshold_ratio=threshold_ratio, z_threshold=z_threshold,
                          min_excess_seconds=min_excess_seconds)

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Release the runner's workers and memory (idempotent)."""
        if not self._closed:
            self._closed = True
            try:
                if self.ledger is not None:
                    self.ledger.run_end(
                        status="ok" if self._failure is None else "failed",
                        steps=self.iteration,
                        extra={
                            "error": self._failure,
                            "audit_records": len(self.audit_records),
                            "audit_mismatches": sum(1 for r in self.audit_records if not r.matched),
                            "quarantined": sorted(self.quarantined),
                            "fit_report": json_ready_report(self.fit_report()) if self.rank_records else None,
                        },
                    )
            finally:
                if self.source is not None:
                    self.source.close()
                if self._owns_runner:
                    self.runner.close()
                if self.engine is not None:
                    from .em_pass.torch_engine import clear_device_cache

                    clear_device_cache()

    def __enter__(self) -> ChunkedEncodedData:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter shutdown
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def handle_from_runner(runner: ChunkRunner, data: Any, options: EncodedDataOptions | None = None, *,
                       num_rows: int | None = None, handle_class: type[ChunkedEncodedData] | None = None,
                       **params: Any) -> ChunkedEncodedData:
    """Wrap a runner as an encoded-data handle (encoding happens now if an encoder is known).

    ``options`` (an :class:`EncodedDataOptions`) and/or ``params``, its fields as keywords (what a
    backend factory received from ``encoded_data`` and did not use itself), make the handle's
    options at once; any other keyword is refused, naming it: an engine keyword is the factory's
    to use or refuse. ``handle_class`` names a subclass to return (e.g. ``RayEncodedData``), built
    with this class's constructor whatever its own takes."""
    opts = handle_options(options, params, where="handle_from_runner")
    handle = ChunkedEncodedData.__new__(handle_class or ChunkedEncodedData)
    ChunkedEncodedData.__init__(handle, runner, data, opts, num_rows=num_rows)
    return handle


def handle_options(options: EncodedDataOptions | None, params: dict[str, Any], *, where: str) -> EncodedDataOptions:
    """``options`` with ``params`` (option names only) applied; an unknown keyword or engine keyword is refused."""
    known = set(option_names())
    unknown = sorted(set(params) - known)
    extra = sorted(options.extra) if options is not None else []
    if unknown or extra:
        names = ", ".join(f"{k}=" for k in unknown + extra)
        raise UnknownOptionError(
            f"{where} does not take {names}: a handle takes the EncodedDataOptions fields "
            f"({', '.join(option_names())}); an engine keyword is the backend factory's to use or refuse")
    if options is None:
        return EncodedDataOptions(**params)
    return options.replace(**params) if params else options


def handle_layout(opts: EncodedDataOptions, num_rows: int, part_rows: Sequence[int] | None = None
                  ) -> tuple[tuple[tuple[int, int], ...], MinibatchSpec, Any]:
    """``(bounds, minibatch spec, placement)`` of a handle of ``num_rows`` rows under ``opts``.

    Every chunk is cut into ``sub_chunks``; with a mini-batch option and no chunking given a mini-batch
    is one chunk (``batch_size`` None: a tenth of the rows); with a placement and no chunking given,
    the placement's chunks. A source's ``part_rows`` cut each part on its own (``sources.source_layout``)."""
    num_chunks, chunk_size = sub_chunked(num_rows, opts.num_chunks, opts.chunk_size, opts.sub_chunks)
    stochastic = opts.batch_size is not None or opts.shuffle is not None or opts.seed is not None
    spec = minibatch_spec(num_rows, opts.batch_size, opts.shuffle, opts.seed, resolve_batch=stochastic)
    if stochastic and num_chunks is None and chunk_size is None:
        chunk_size = spec.batch_size
    placement = opts.placement
    if placement is not None and num_chunks is None and chunk_size is None:
        # the plan's chunks, unless chunking is given (any other placement= is refused by check_placement)
        num_chunks = placement.num_chunks if isinstance(placement, Placement) else None
    if part_rows is not None:
        return tuple((p.start, p.stop) for p in source_layout(part_rows, num_chunks, chunk_size)), spec, placement
    return chunk_bounds(num_rows, num_chunks, chunk_size), spec, placement


def _resource_placement(bounds: Sequence[tuple[int, int]], data: Any, resources: Any, estimator: Any, model: Any,
                        encoder: Any) -> Placement:
    """The planner's placement of the chunks over ``resources`` (rows by throughput); one that does not fit a
    device's memory is refused."""
    if data is None or as_source(data) is not None:
        raise ValueError("resources= places rows by the devices' throughput, which needs the rows in this process")
    placement = placement_for_bounds(bounds, data, model=model, estimator=estimator, encoder=encoder,
                                     resources=resources)
    if not placement.fits:
        raise ValueError(f"resources= cannot hold the data: {'; '.join(placement.notes)}; give devices more "
                         "memory (or more devices), or drop resources=")
    return placement


def _engine_of(engine: Any, precision: Any, estimator: Any, model: Any) -> EngineChoice | None:
    """The handle's engine: a resolved ``EngineChoice`` as given (``encoded_data`` resolves it), else parsed
    and checked here (a backend author calling ``handle_from_runner(engine="torch")``)."""
    if engine is None or (isinstance(engine, EngineChoice) and engine.device is not None):
        return engine
    choice = resolve_engine(engine, precision) if not isinstance(engine, EngineChoice) else engine
    if choice is None:
        return None
    from .em_pass.torch_engine import check_engine

    return check_engine(choice, estimator, model)
