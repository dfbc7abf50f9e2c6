"""``mixle-parallel verify-run RUN_DIR``: one offline check of everything a run folder holds, with public keys only.

It reuses the verifiers each part already has and adds only the checks that tie them together:

* each ``certificate*.json``: signature (``attestation.open_envelope``) and the verdict re-derived from its
  embedded evidence (``certificate.evidence_verdict_problems``);
* each ledger (a ``*.jsonl`` with a signed ``.head`` beside it): ``verify_ledger`` (chain, seals, head);
* each checkpoint root (a folder with ``LATEST``): every generation's signature and lineage
  (``checkpoint_trust.generation_lineage``), its manifest (``read_manifest`` against the signed sha256)
  and its files (``manifest_problems``), the chain of generations and the pointer;
* each ``*.intoto.json``: signature under purpose ``provenance`` and subjects against the files
  (``provenance.open_provenance``, ``subject_problems``);
* agreement: the ledger a statement names holds, at the entry count it recorded, the head and the
  run_start it recorded; that run's certificate is the statement's, and the folder holds it with the same
  envelope digest; a checkpoint statement's run id is its generation's signed run id;
* files: any file none of the above accounts for is named (``receipts.jsonl``, ``summary.json`` and
  ``report.html`` are listed as unsigned context instead).

Nothing is written, not even to the trust store (an auditor's check records no checkpoint marks).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from mixle_parallel.contracts import ContractError, NotAdmittedError
from mixle_parallel.contracts.certificate import evidence_verdict_problems
from mixle_parallel.verification.attestation import load_certificate, open_envelope
from mixle_parallel.verification.keys import TrustStore, TrustStoreError
from mixle_parallel.verification.ledger import head_path, verify_ledger
from mixle_parallel.verification.provenance import (
    STATEMENT_SUFFIX,
    ProvenanceError,
    certificate_digest,
    ledger_binding,
    open_provenance,
    subject_problems,
)

__all__ = ["CONTEXT_FILES", "RunCheck", "RunVerdict", "main_verify_run", "verify_run"]

CONTEXT_FILES = frozenset({"receipts.jsonl", "summary.json", "report.html"})
"""Files a run folder may hold that no key signs (a copy of the ledger's receipts, the demo's figures, the report)."""


@attrs.frozen
class RunCheck:
    """One verdict: what was checked (``check``), on which file or folder (``target``), and what was found."""

    check: str
    target: str
    ok: bool
    detail: str


@attrs.frozen
class RunVerdict:
    """Every check of a run folder; ``ok`` when none failed."""

    run_dir: str
    checks: tuple[RunCheck, ...]
    unsigned: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when every check passed (and there was something to check)."""
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failures(self) -> tuple[RunCheck, ...]:
        """The checks that failed."""
        return tuple(c for c in self.checks if not c.ok)

    def to_json(self) -> dict[str, Any]:
        """The verdict as a JSON document (``--json``)."""
        return {"run_dir": self.run_dir, "ok": self.ok, "checks": [attrs.asdict(c) for c in self.checks],
                "unsigned": list(self.unsigned)}


class _Walk:
    """The state of one verification: the folder, the keys, checks so far and the files accounted for."""

    def __init__(self, run_dir: Path, store: TrustStore) -> None:
        self.run_dir, self.store = run_dir, store
        self.checks: list[RunCheck] = []
        self.accounted: set[Path] = set()
        self.certificates: dict[str, str] = {}  # certificate id -> envelope digest
        self.ledgers: dict[str, Path] = {}  # name -> path (verified)
        self.generations: dict[Path, str] = {}  # generation folder -> signed run id

    def rel(self, path: Path) -> str:
        """``path`` relative to the run folder, as the table names it."""
        return path.relative_to(self.run_dir).as_posix() if path.is_relative_to(self.run_dir) else str(path)

    def add(self, check: str, target: Path, problems: Sequence[str], ok_detail: str) -> None:
        """One check: passed with ``ok_detail``, or failed with every problem."""
        self.checks.append(RunCheck(check, self.rel(target), not problems,
                                    "; ".join(problems) if problems else ok_detail))

    def account(self, *paths: Path) -> None:
        """Mark files as covered by some check."""
        self.accounted.update(p.resolve() for p in paths)


def _certificates(walk: _Walk) -> None:
    for path in sorted(walk.run_dir.glob("certificate*.json")):
        walk.account(path)
        try:
            envelope = load_certificate(path)
            certificate, keyid = open_envelope(envelope, walk.store)
        except (NotAdmittedError, ContractError, OSError) as exc:
            walk.add("certificate", path, [str(exc)], "")
            continue
        problems = evidence_verdict_problems(certificate)
        walk.certificates[certificate.certificate_id] = certificate_digest(envelope)
        walk.add("certificate", path, problems,
                 f"{certificate.executor} {certificate.measured_plan.describe()} {certificate.precision}: "
                 f"signed by {keyid[:16]}..., {len(certificate.evidence)} evidence records re-checked")


def _ledgers(walk: _Walk) -> None:
    for path in sorted(walk.run_dir.rglob("*.jsonl")):
        if not os.path.lexists(head_path(path)):
            continue
        walk.account(path, head_path(path))
        report = verify_ledger(path, trust_store=walk.store)
        if report.ok:
            walk.ledgers[path.name] = path
        walk.add("ledger", path, [str(f) for f in report.faults[:5]],
                 f"{report.entries} entries, {report.runs} run(s), {report.receipts} receipts, {report.audits} "
                 f"audits; {report.signed_head}")


def _breaks_chain(gen: Path, lineage: Any, previous: tuple[str, str, str]) -> bool:
    """Whether ``gen``'s signed lineage contradicts the generation before it in the folder (name, digest, run);
    a previous generation that is no longer in the folder (removed by hand) is not a contradiction."""
    name, digest, run_id = previous
    if lineage.run_id != run_id:
        return True
    if lineage.previous == name:
        return bool(lineage.previous_manifest_sha256 != digest)
    return lineage.previous is None or os.path.lexists(gen.parent / lineage.previous)


def _generation(walk: _Walk, gen: Path, previous: tuple[str, str, str] | None) -> tuple[str, str, str] | None:
    """Check one generation; (name, signed manifest sha256, run id) when its signature holds."""
    from mixle_parallel.executors.torch.checkpoint_manifest import (
        MANIFEST_NAME,
        SIGNATURE_NAME,
        SUCCESS_NAME,
        CheckpointError,
        manifest_problems,
        read_manifest,
    )
    from mixle_parallel.executors.torch.checkpoint_trust import generation_lineage

    walk.account(gen / MANIFEST_NAME, gen / SIGNATURE_NAME, gen / SUCCESS_NAME)
    try:
        digest, lineage = generation_lineage(gen, trust_store=walk.store)
        manifest = read_manifest(gen, digest)
    except (CheckpointError, TrustStoreError) as exc:
        walk.add("checkpoint", gen, [str(exc)], "")
        return None
    walk.account(*(gen / rel for rel in manifest["files"]))
    problems = [f"{walk.rel(Path(file))}: {problem}" for file, problem in manifest_problems(gen, manifest)]
    if previous is not None and _breaks_chain(gen, lineage, previous):
        problems.append(f"its signed lineage (previous {lineage.previous}, run {lineage.run_id}) does not follow "
                        f"{previous[0]} of run {previous[2]}: a generation was swapped or copied in")
    walk.generations[gen.resolve()] = lineage.run_id
    walk.add("checkpoint", gen, problems, f"generation {lineage.number} of run {lineage.run_id[:12]}..., "
                                          f"{len(manifest['files'])} files match the signed manifest")
    return gen.name, digest, lineage.run_id


def _checkpoints(walk: _Walk) -> None:
    from mixle_parallel.executors.torch.checkpoint_manifest import (
        MIXLE_POINTER_NAME,
        POINTER_NAME,
        SUCCESS_NAME,
        CheckpointError,
        generation_number,
        resolve,
    )

    for pointer in sorted(walk.run_dir.rglob(POINTER_NAME)):
        root = pointer.parent
        walk.account(pointer, root / MIXLE_POINTER_NAME, root / SUCCESS_NAME)
        previous: tuple[str, str, str] | None = None
        for gen in sorted(p for p in root.iterdir() if p.is_dir() and generation_number(p.name) is not None):
            previous = _generation(walk, gen, previous) or previous
        try:
            named, digest = resolve(root)
        except CheckpointError as exc:
            walk.add("checkpoint", pointer, [str(exc)], "")
            continue
        ok = previous is not None and (named.name, digest) == previous[:2]
        walk.add("checkpoint", pointer, [] if ok else [f"the pointer names {named.name}, not the newest signed "
                                                      f"generation {previous[0] if previous else '(none)'}"],
                 f"names {named.name}, the newest signed generation")


def _agreement(walk: _Walk, path: Path, statement: Mapping[str, Any]) -> list[str]:
    """What a verified statement says about its run that the ledger, certificates or checkpoints contradict."""
    predicate = statement["predicate"]
    byproducts = {b.get("name", ""): b.get("annotations", {}) for b in predicate["runDetails"]["byproducts"]}
    deps = {d.get("name", ""): d for d in predicate["buildDefinition"]["resolvedDependencies"]}
    external = predicate["buildDefinition"]["externalParameters"]
    problems: list[str] = []
    named = [n for n in byproducts if n.startswith("ledger:")]
    recorded = byproducts[named[0]] if named else {}
    ledger = walk.ledgers.get(named[0].removeprefix("ledger:")) if named else None
    if ledger is None:
        problems.append(f"it names ledger {named[0] if named else '(none)'}, which this folder does not hold "
                        "verified")
    else:
        try:
            binding = ledger_binding(ledger, trust_store=walk.store, entries=int(recorded.get("entries", 0)))
            for field, value in (("head", binding.head), ("run_start_hash", binding.run_start_hash),
                                 ("certificate", binding.certificate)):
                if recorded.get(field) != value:
                    problems.append(f"it names ledger {field} {str(recorded.get(field))[:23]}..., the ledger has "
                                    f"{value[:23]}... at entry {binding.entries - 1}")
        except ProvenanceError as exc:
            problems.append(str(exc))
    certificate = deps.get("certificate", {})
    cert_id = (certificate.get("annotations") or {}).get("certificate_id")
    if cert_id is None:
        problems.append("the run was not admitted under a certificate (unverified)")
    elif cert_id != recorded.get("certificate"):
        problems.append(f"it names certificate {cert_id[:23]}..., its ledger run "
                        f"{str(recorded.get('certificate'))[:23]}...")
    elif walk.certificates.get(cert_id) != "sha256:" + str((certificate.get("digest") or {}).get("sha256")):
        problems.append(f"certificate {cert_id[:23]}... is not in this folder with the envelope digest it names")
    artefact = (external.get("artefact") or {})
    if artefact.get("kind") == "checkpoint-generation":
        gen = (path.parent / str(artefact.get("name"))).resolve()
        if walk.generations.get(gen) != external.get("run_id"):
            problems.append(f"it names run {external.get('run_id')}, the generation's signature "
                            f"{walk.generations.get(gen, '(does not verify)')}")
    return problems


def _statements(walk: _Walk) -> None:
    for path in sorted(walk.run_dir.rglob("*" + STATEMENT_SUFFIX)):
        walk.account(path)
        try:
            statement, keyid = open_provenance(path, trust_store=walk.store)
        except ProvenanceError as exc:
            walk.add("provenance", path, [str(exc)], "")
            continue
        subjects = statement["subject"]
        walk.account(*(path.parent / str(s.get("name")) for s in subjects if isinstance(s, Mapping)))
        problems = [f"{walk.rel(Path(file))}: {problem}" for file, problem in subject_problems(path, statement)]
        walk.add("provenance", path, problems, f"{len(subjects)} subjects match, signed by {keyid[:16]}...")
        try:
            disagreements = _agreement(walk, path, statement)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            disagreements = [f"the statement's predicate is not one this library writes: {exc}"]
        walk.add("agreement", path, disagreements, "names the ledger head, run and certificate this folder holds")


def _files(walk: _Walk) -> tuple[str, ...]:
    unsigned, extra = [], []
    for path in sorted(walk.run_dir.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue
        if path.resolve() in walk.accounted and not path.is_symlink():
            continue
        (unsigned if path.name in CONTEXT_FILES and path.parent == walk.run_dir else extra).append(walk.rel(path))
    walk.checks.append(RunCheck("files", ".", not extra,
                                f"extra: {', '.join(extra)} (no signed evidence covers them)" if extra
                                else "every file is covered by signed evidence"))
    return tuple(unsigned)


def verify_run(run_dir: str | os.PathLike[str], *, trust_store: TrustStore | None = None) -> RunVerdict:
    """Check a run folder offline against ``trust_store``'s public keys; see the module docstring."""
    folder = Path(run_dir).resolve()
    if not folder.is_dir():
        raise ValueError(f"no run folder at {run_dir}")
    walk = _Walk(folder, trust_store or TrustStore())
    _certificates(walk)
    _ledgers(walk)
    _checkpoints(walk)
    _statements(walk)
    unsigned = _files(walk)
    return RunVerdict(str(folder), tuple(walk.checks), unsigned)


@contextmanager
def _keys_store(keys: Sequence[str]) -> Iterator[TrustStore]:
    """A throw-away trust store trusting ``keys`` (PEM files) for every purpose."""
    with tempfile.TemporaryDirectory(prefix="mixle-verify-run-") as home:
        store = TrustStore(home)
        for key in keys:
            store.trust(key, label=os.path.basename(key))
        yield store


def _table(verdict: RunVerdict) -> Any:
    from rich.table import Table

    table = Table(title=f"verify-run {verdict.run_dir}: {'OK' if verdict.ok else 'FAILED'}", title_justify="left")
    for column in ("check", "target", "verdict", "detail"):
        table.add_column(column, overflow="fold")
    for check in verdict.checks:
        table.add_row(check.check, check.target, "[green]ok[/green]" if check.ok else "[red]FAIL[/red]", check.detail)
    for name in verdict.unsigned:
        table.add_row("context", name, "unsigned", "not covered by any signature (for reading only)")
    return table


def main_verify_run(argv: Sequence[str] | None = None) -> int:
    """``mixle-parallel verify-run RUN_DIR``: exit 0 when every check passes, 1 when one fails, 2 for bad input."""
    parser = argparse.ArgumentParser(prog="mixle-parallel verify-run",
                                     description=(__doc__ or "").split("\n")[0].replace("``", ""))
    parser.add_argument("run_dir", help="the run folder (e.g. what `mixle-parallel demo` wrote)")
    trust = parser.add_mutually_exclusive_group()
    trust.add_argument("--trusted-key", action="append", default=[], metavar="PUB.pem",
                       help="trust only this public key (repeatable), for every purpose; else the trust store")
    trust.add_argument("--trust-store", metavar="DIR", help="the trust store folder to use (default: "
                                                            "$MIXLE_PARALLEL_HOME or ~/.config/mixle-parallel)")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not Path(args.run_dir).is_dir():
        print(f"mixle-parallel verify-run: no run folder at {args.run_dir!r}", file=sys.stderr)
        return 2
    missing = [key for key in args.trusted_key if not Path(key).is_file()]
    if missing:
        print(f"mixle-parallel verify-run: no public key file at {missing[0]!r}; pass the producer's "
              "signing-key.pub (from their trust store)", file=sys.stderr)
        return 2
    try:
        if args.trusted_key:
            with _keys_store(args.trusted_key) as store:
                verdict = verify_run(args.run_dir, trust_store=store)
        else:
            verdict = verify_run(args.run_dir, trust_store=TrustStore(args.trust_store) if args.trust_store
                                 else None)
    except (TrustStoreError, OSError) as exc:
        print(f"mixle-parallel verify-run: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(verdict.to_json(), indent=2))
    else:
        from rich.console import Console

        Console(width=max(Console().width, 120)).print(_table(verdict))
    return 0 if verdict.ok else 1
