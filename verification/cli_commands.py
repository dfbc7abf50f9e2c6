"""Command functions for the lead's CLI: ``mixle-parallel verify``, ``certify`` and ``keys``.

``verify`` and ``certify`` take a backend as a registered name (training or EM, built-in or
third-party) or ``module:attr`` (``backend_names``; ``--import MODULE`` first imports a module that
registers one), run the harness on a small real mesh and print the per-update table (``--junit-xml PATH``
also writes it as JUnit XML, one testcase per update, as ``conformance`` does); ``certify`` also
writes the certificate (a DSSE envelope signed with this machine's Ed25519 key, made on first use)
and keeps it in the local store where automatic admission finds it. ``keys init|trust|list|revoke|policy``
manages the trust store (``trust --for certify,ledger,checkpoint,provenance`` scopes a key).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..contracts import to_dict
from .attestation import open_envelope, save_certificate
from .backend_names import add_backend_arguments, harness_target, import_modules
from .certification import CertificationError
from .conformance.junit import junit_xml
from .conformance.suite import CheckResult, parse_plan
from .harness.run import verify
from .harness.worker import resolve_executor
from .keys import CertificationPolicy, KeyPurpose, TrustStore, TrustStoreError

__all__ = ["main_certify", "main_keys", "main_verify"]


def _parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    add_backend_arguments(parser)
    parser.add_argument("--plan", required=True, help="plan, e.g. 'dp_shard=2,tp=2'")
    parser.add_argument("--precision", default=None,
                        help="fp32, fp64, bf16, ... (default: fp32, or the backend's only precision)")
    parser.add_argument("--workload", default=None,
                        help="mlp, tiny_lm, attention or gaussian_mixture (default: chosen for the backend and plan)")
    parser.add_argument("--trials", type=int, default=1, help="seeds to run (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--junit-xml", default=None, metavar="PATH",
                        help="also write the results as a JUnit XML report here (one testcase per update)")
    return parser


def _update_results(report: Any) -> list[CheckResult]:
    """One ``CheckResult`` per declared update of ``report`` (passed: no failure names it), then the failures
    that name no update (e.g. a wire check over every update)."""
    results, claimed = [], set()
    share = report.seconds / max(1, len(report.updates))
    by_node = {e.node_id: e for e in report.evidence}
    for update in report.updates:
        where = f"update {update.node_id!r}"
        failures = [f for f in report.failures if f.startswith(where)]
        claimed.update(failures)
        evidence = by_node.get(update.node_id)
        passed = not failures and evidence is not None and evidence.passed
        measured = (f"max abs {evidence.maximum_absolute_error:.3g}, max rel {evidence.maximum_relative_error:.3g}, "
                    f"deterministic {evidence.deterministic}; " + "; ".join(evidence.notes)) if evidence else ""
        detail = "\n".join(failures) if failures else (measured or "no evidence recorded")
        results.append(CheckResult(f"update {update.node_id}", passed, detail, share))
    rest = [f for f in report.failures if f not in claimed]
    if rest:
        results.append(CheckResult("harness", False, "\n".join(rest), 0.0))
    return results


def _write_junit(path: str | None, prog: str, backend: str, results: Sequence[CheckResult]) -> None:
    """Write ``results`` as JUnit XML at ``path`` (the same writer as ``conformance --junit-xml``)."""
    if path:
        Path(path).write_text(junit_xml(results, backend=backend, suite_name=prog), encoding="utf-8")


Resolver = Callable[[str], Any]
"""Maps a ``--backend`` value to what the harness measures (default: ``backend_names.harness_target``)."""


def _run(args: argparse.Namespace, prog: str, resolve: Resolver):  # noqa: ANN202 - report or None
    try:
        plan = parse_plan(args.plan)
        if plan is None:
            raise ValueError("--plan names no axis; give at least one, e.g. --plan dp_shard=2")
        import_modules(args.imports)
        target = harness_target(resolve(args.backend))
        executor = resolve_executor(target)
    except (ValueError, KeyError) as exc:
        print(f"{prog}: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return None
    args.target = target
    if args.precision is None:
        precisions = executor.capabilities.precisions
        args.precision = "fp32" if "fp32" in precisions or not precisions else sorted(precisions)[0]
    return verify(target, plan, precision=args.precision, workload=args.workload, trials=args.trials,
                  seed=args.seed)


def main_verify(argv: Sequence[str] | None = None, *, resolve: Resolver = harness_target) -> int:
    """``mixle-parallel verify``: measure a backend on a plan; exit 1 when a check fails."""
    parser = _parser("mixle-parallel verify", main_verify.__doc__)
    parser.add_argument("--json", action="store_true", help="print the evidence as JSON documents")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    report = _run(args, "mixle-parallel verify", resolve)
    if report is None:
        return 2
    if args.json:
        print(json.dumps({"passed": report.passed, "failures": list(report.failures),
                          "evidence": [to_dict(e) for e in report.evidence],
                          "updates": [to_dict(u) for u in report.updates]}, indent=2, sort_keys=True))
    else:
        print(report.summary())
    _write_junit(args.junit_xml, "mixle-parallel verify", args.backend, _update_results(report))
    return 0 if report.passed else 1


def main_certify(argv: Sequence[str] | None = None, *, resolve: Resolver = harness_target) -> int:
    """``mixle-parallel certify``: verify, then write the certificate; exit 1 when not certifiable."""
    parser = _parser("mixle-parallel certify", main_certify.__doc__)
    parser.add_argument("--out", default=None, help="also write the certificate document here")
    parser.add_argument("--no-store", action="store_true", help="do not keep it in the local certificate store")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    report = _run(args, "mixle-parallel certify", resolve)
    if report is None:
        return 2
    print(report.summary())
    results = _update_results(report)

    def done(code: int, detail: str) -> int:
        results.append(CheckResult("certificate", code == 0, detail, 0.0))
        _write_junit(args.junit_xml, "mixle-parallel certify", args.backend, results)
        return code

    try:
        envelope = report.certify(args.target, store=not args.no_store)
    except CertificationError as exc:
        print(f"not certified: {exc}", file=sys.stderr)
        return done(1, f"not certified: {exc}")
    except TrustStoreError as exc:
        print(f"mixle-parallel certify: {exc}", file=sys.stderr)
        return done(2, str(exc))
    certificate, keyid = open_envelope(envelope)
    where = [] if args.no_store else [f"stored in {TrustStore().home / 'certificates'}"]
    if args.out:
        where.append(f"written to {save_certificate(envelope, args.out)}")
    line = f"certificate {certificate.certificate_id} signed by key {keyid[:16]}... {'; '.join(where)}"
    print(line)
    return done(0, line)


def _keys_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mixle-parallel keys", description=main_keys.__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("init", help="make this machine's Ed25519 signing key (mode 0600) and trust it for every purpose")
    trust = sub.add_parser("trust", help="trust a public key (a PEM file, e.g. your CI's signing-key.pub)")
    trust.add_argument("pubkey")
    trust.add_argument("--label", default="", help="who holds the key (e.g. 'org CI')")
    trust.add_argument("--for", dest="purposes", default=None, metavar="PURPOSES",
                       help=f"what it may sign, comma-separated: {','.join(p.value for p in KeyPurpose)} "
                            "(default: all; again on a trusted key: replaces its purposes)")
    sub.add_parser("list", help="list trusted and revoked keys with their purposes, and the policy")
    revoke = sub.add_parser("revoke", help="revoke a key (its id, or a prefix of 8+ hex digits), every entry of it")
    revoke.add_argument("keyid")
    policy = sub.add_parser("policy", help="show or set automatic certification: on (default), off, "
                                           "trusted-keys-only (never create a signing key implicitly)")
    policy.add_argument("value", nargs="?", choices=[p.value for p in CertificationPolicy])
    return parser


def _keys_action(store: TrustStore, args: argparse.Namespace) -> None:
    if args.action == "init":
        entry = store.init()
        print(f"signing key {entry.keyid} made at {store.signing_key_path} (mode 0600); "
              f"share {store.public_key_path} with machines that should trust it")
    elif args.action == "trust":
        entry = store.trust(args.pubkey, label=args.label, purposes=args.purposes)
        print(f"trusted key {entry.keyid} for {entry.describe_purposes()} {entry.label}".rstrip())
    elif args.action == "revoke":
        entry = store.revoke(args.keyid)
        print(f"revoked key {entry.keyid} at {entry.revoked_at}")
    elif args.action == "policy":
        value = store.set_policy(args.value) if args.value else store.policy()
        print(f"automatic certification: {value.value} ({store.policy_path})")
    else:
        for entry in store.keys():
            state = f"revoked {entry.revoked_at}" if entry.revoked else "trusted"
            print(f"{entry.keyid}  {state:<40}  {entry.describe_purposes():<25}  {entry.label}".rstrip())
        print(f"trust store: {store.home}; automatic certification: {store.policy().value}")


def main_keys(argv: Sequence[str] | None = None) -> int:
    """``mixle-parallel keys init|trust PUBKEY [--for ...]|list|revoke KEYID|policy [on|off|trusted-keys-only]``."""
    args = _keys_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        _keys_action(TrustStore(), args)
    except (TrustStoreError, OSError) as exc:
        print(f"mixle-parallel keys: {exc}", file=sys.stderr)
        return 2
    return 0
