"""Command functions for the lead's CLI: ``mixle-parallel verify`` and ``mixle-parallel certify``.

Both take a backend as ``module:attr`` (the facade maps registered names to such specs), run the
harness on a small real mesh and print the per-update table; ``certify`` also writes the
certificate document (HMAC-signed when a key is configured).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mixle_parallel.contracts import to_dict
from mixle_parallel.verification.admission import CertificationError, save_certificate
from mixle_parallel.verification.conformance.suite import parse_plan
from mixle_parallel.verification.harness.run import verify
from mixle_parallel.verification.harness.worker import resolve_executor
from mixle_parallel.verification.keys import KEY_ENV, load_key

__all__ = ["main_certify", "main_verify"]


def _parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("--backend", required=True, help="backend as 'package.module:attribute'")
    parser.add_argument("--plan", required=True, help="plan, e.g. 'dp_shard=2,tp=2'")
    parser.add_argument("--precision", default=None,
                        help="fp32, fp64, bf16, ... (default: fp32, or the backend's only precision)")
    parser.add_argument("--workload", default=None,
                        help="mlp, tiny_lm, attention or gaussian_mixture (default: chosen for the backend and plan)")
    parser.add_argument("--trials", type=int, default=1, help="seeds to run (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    return parser


Resolver = Callable[[str], Any]
"""Maps a ``--backend`` value to an executor object or ``module:attr`` spec (the facade maps registry names)."""


def _identity(spec: str) -> Any:
    return spec


def _run(args: argparse.Namespace, prog: str, resolve: Resolver):  # noqa: ANN202 - report or None
    try:
        plan = parse_plan(args.plan)
        if plan is None:
            raise ValueError("--plan names no axis; give at least one, e.g. --plan dp_shard=2")
        target = resolve(args.backend)
    except (ValueError, KeyError) as exc:
        print(f"{prog}: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return None
    args.target = target
    if args.precision is None:
        precisions = resolve_executor(target).capabilities.precisions
        args.precision = "fp32" if "fp32" in precisions or not precisions else sorted(precisions)[0]
    return verify(target, plan, precision=args.precision, workload=args.workload, trials=args.trials,
                  seed=args.seed)


def main_verify(argv: Sequence[str] | None = None, *, resolve: Resolver = _identity) -> int:
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
    return 0 if report.passed else 1


def main_certify(argv: Sequence[str] | None = None, *, resolve: Resolver = _identity) -> int:
    """``mixle-parallel certify``: verify, then write the certificate; exit 1 when not certifiable."""
    parser = _parser("mixle-parallel certify", main_certify.__doc__)
    parser.add_argument("--out", required=True, help="where to write the certificate document")
    parser.add_argument("--key-file", default=None,
                        help=f"HMAC key file (else {KEY_ENV['cert'][0]} or {KEY_ENV['cert'][1]}; unsigned if none)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        key = load_key(key_file=args.key_file, purpose="cert")
    except (OSError, ValueError) as exc:
        print(f"mixle-parallel certify: {exc}", file=sys.stderr)
        return 2
    report = _run(args, "mixle-parallel certify", resolve)
    if report is None:
        return 2
    print(report.summary())
    try:
        certificate = report.certify(args.target, key=key)
    except CertificationError as exc:
        print(f"not certified: {exc}", file=sys.stderr)
        return 1
    path = save_certificate(certificate, args.out)
    print(f"certificate {certificate.certificate_id} ({'signed' if certificate.signature else 'unsigned'}) "
          f"written to {path}")
    return 0
