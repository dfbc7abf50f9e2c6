"""The ``mixle-parallel`` command line: plan inspection, contract schemas, and the run commands."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mixle_parallel import contracts as c
from mixle_parallel import executors

EXIT_BAD_INPUT = 2
_PASS_THROUGH = ("verify", "certify", "audit", "conformance", "keys", "demo", "verify-run", "report")
"""Commands whose arguments are passed on as they are (argparse's REMAINDER cannot start with an option)."""
_PLAN_FIELDS = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "etp", "microbatches",
                "gradient_accumulation_steps")


class _Fail(Exception):
    """A one-line user error: printed as ``error: ...`` with exit code 2."""


def _load_plan(args: argparse.Namespace) -> c.ParallelPlan:
    """A plan from --plan FILE (a ParallelPlan document or a plain object of sizes) or the axis flags."""
    flags = {f: getattr(args, f) for f in _PLAN_FIELDS if getattr(args, f) is not None}
    if args.plan is None:
        return c.ParallelPlan(**flags)
    if flags:
        raise _Fail(f"give either --plan FILE or axis flags, not both (got {', '.join(sorted(flags))})")
    try:
        text = Path(args.plan).read_text(encoding="utf-8")
    except OSError as exc:
        raise _Fail(f"cannot read plan file {args.plan}: {exc.strerror}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Fail(f"plan file {args.plan} is not JSON: {exc}") from None
    if isinstance(document, dict) and "kind" in document:
        return c.from_dict(document, c.ParallelPlan)
    if not isinstance(document, dict):
        raise _Fail(f"plan file {args.plan} must hold a JSON object, got {type(document).__name__}")
    return c.ParallelPlan.from_mapping(document)


def _cmd_plan(args: argparse.Namespace, console: Console) -> int:
    plan = _load_plan(args)
    if args.backend:
        try:
            backend = executors.get_training_backend(args.backend)
        except KeyError as exc:
            raise _Fail(str(exc.args[0])) from None
        backend.capabilities.validate(plan, precision=args.precision)
    if args.json:
        layout = {
            "plan": c.to_dict(plan),
            "ranks": [plan.coordinate(r).as_dict() for r in range(plan.world_size)],
            "groups": {a.value: [list(g) for g in plan.axis_group_ranks(a)] for a in plan.active_axes},
        }
        console.print_json(json.dumps(layout))
        return 0
    console.print(f"[bold]plan[/bold] {plan.describe()}; mesh {dict(zip(plan.mesh.names, plan.mesh.shape)) or '{}'}; "
                  f"microbatches={plan.microbatches}, accumulation={plan.gradient_accumulation_steps}")
    ranks = Table(title="rank -> coordinate", show_lines=False)
    ranks.add_column("rank", justify="right")
    for axis in c.ALL_AXES:
        ranks.add_column(axis.value, justify="right")
    for r in range(plan.world_size):
        coord = plan.coordinate(r)
        ranks.add_row(str(r), *(str(coord[a]) for a in c.ALL_AXES))
    console.print(ranks)
    groups = Table(title="process groups per active axis")
    groups.add_column("axis")
    groups.add_column("size", justify="right")
    groups.add_column("groups (ranks)")
    for axis in plan.active_axes:
        groups.add_row(axis.value, str(plan.size(axis)),
                       "  ".join("[" + ",".join(map(str, g)) + "]" for g in plan.axis_group_ranks(axis)))
    if plan.active_axes:
        console.print(groups)
    if args.backend:
        console.print(f"backend [bold]{args.backend}[/bold] executes this plan at {args.precision}")
    return 0


def _cmd_schema(args: argparse.Namespace, console: Console) -> int:
    if args.kind is None:
        for name in sorted(c.CONTRACT_TYPES):
            console.print(name)
        return 0
    cls = c.CONTRACT_TYPES.get(args.kind)
    if cls is None:
        raise _Fail(f"unknown contract kind {args.kind!r}; known: {', '.join(sorted(c.CONTRACT_TYPES))}")
    print(json.dumps(c.json_schema(cls), indent=2, sort_keys=True))
    return 0


def _pass_through(name: str):  # noqa: ANN202 - handler factory
    """A handler that hands the remaining arguments to a verification command function.

    verify, certify and conformance resolve ``--backend NAME`` through the executors' registry (imported
    with this module), after ``--import MODULE`` and the ``mixle_parallel.backends`` entry points.
    """

    def handler(args: argparse.Namespace, console: Console) -> int:
        from mixle_parallel import verification

        return int(getattr(verification, name)(args.rest))

    return handler


def _cmd_checkpoint(args: argparse.Namespace, console: Console) -> int:
    """``checkpoint repair-mark ROOT``: rebuild this machine's damaged high-water records of a checkpoint root."""
    from mixle_parallel.executors.torch.checkpoint_manifest import CheckpointError
    from mixle_parallel.executors.torch.checkpoint_trust import repair_marks
    from mixle_parallel.verification.keys import TrustStoreError

    try:
        done = repair_marks(args.root)
    except (CheckpointError, TrustStoreError, OSError) as exc:
        raise _Fail(f"cannot repair the records of {args.root}: {exc}") from None
    for line in done:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0


def _cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from mixle_parallel.demo.run import run_demo

    return run_demo(args.rest, console)


_RUN_COMMANDS = {
    "verify-run": ("mixle_parallel.run_verification", "main_verify_run",
                   "check a run folder offline: certificates, ledger, checkpoints, provenance, and that they agree"),
    "report": ("mixle_parallel.run_report", "main_report",
               "write one self-contained HTML page with the run's plots (loss, step times, audits, EM, verdict)"),
}
"""Commands on a run folder (module, function, help); their arguments are passed on as they are."""


def _run_command(name: str):  # noqa: ANN202 - handler factory
    """A handler that hands the remaining arguments to a run-folder command."""

    def handler(args: argparse.Namespace, console: Console) -> int:
        from importlib import import_module

        module, function, _ = _RUN_COMMANDS[name]
        return int(getattr(import_module(module), function)(args.rest))

    return handler


def _add_plan_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", metavar="FILE.json", help="a ParallelPlan document (or an object of sizes)")
    for field in _PLAN_FIELDS:
        parser.add_argument("--" + field.replace("_", "-"), dest=field, type=int, metavar="N")


_COMMANDS = {
    "verify": ("main_verify", "measure a backend (a registered training or EM backend name, or module:attr; "
                              "--import MODULE registers a third party's) against the single-process reference "
                              "on a small real mesh"),
    "certify": ("main_certify", "verify, then sign and store an admission certificate for the plan family"),
    "keys": ("main_keys", "the trust store: keys init | trust PUBKEY [--for certify,ledger,checkpoint,provenance] | "
                          "list | revoke KEYID | policy [on|off|trusted-keys-only]"),
    "audit": ("main_audit", "verify a ledger's hash chain, step order and certificate links"),
    "conformance": ("main_conformance", "run the standard contract and executor checks against a backend "
                                        "(registered name or module:attr, as verify)"),
}
"""Commands that hand their arguments to a verification command function (name, help)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="mixle-parallel", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="validate a plan; print rank coordinates and process groups")
    _add_plan_flags(plan)
    plan.add_argument("--backend", help="also check the plan against this registered training backend")
    plan.add_argument("--precision", default="fp32", help="precision to check with --backend (default fp32)")
    plan.add_argument("--json", action="store_true", help="print the layout as JSON")
    plan.set_defaults(handler=_cmd_plan)

    schema = sub.add_parser("schema", help="print the JSON Schema of a contract (no KIND: list the kinds)")
    schema.add_argument("kind", nargs="?", metavar="KIND")
    schema.set_defaults(handler=_cmd_schema)

    checkpoint = sub.add_parser("checkpoint", help="checkpoint records: repair-mark ROOT rebuilds this machine's "
                                                   "damaged high-water records from ROOT's signed generations")
    actions = checkpoint.add_subparsers(dest="action", required=True)
    repair = actions.add_parser("repair-mark", help="move a damaged record aside and rebuild it from the newest "
                                                    "generation of ROOT's run signed by a trusted key")
    repair.add_argument("root", metavar="ROOT", help="the checkpoint root (the folder holding LATEST)")
    repair.set_defaults(handler=_cmd_checkpoint)

    for command, (function, text) in _COMMANDS.items():
        passthrough = sub.add_parser(command, help=text, add_help=False)
        passthrough.add_argument("rest", nargs=argparse.REMAINDER)
        passthrough.set_defaults(handler=_pass_through(function))
    for command, (_, _, text) in _RUN_COMMANDS.items():
        passthrough = sub.add_parser(command, help=text, add_help=False)
        passthrough.add_argument("rest", nargs=argparse.REMAINDER)
        passthrough.set_defaults(handler=_run_command(command))
    demo = sub.add_parser("demo", help="the main job: a certified, audited run on a local 4-rank CPU mesh",
                          add_help=False)
    demo.add_argument("rest", nargs=argparse.REMAINDER)
    demo.set_defaults(handler=_cmd_demo)
    return parser


def _version() -> str:
    from mixle_parallel._version import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (2 and one line on stderr for bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] in _PASS_THROUGH:
        # argparse's REMAINDER cannot start with an option, so these commands take argv as it is.
        handler = (_cmd_demo if argv[0] == "demo" else _run_command(argv[0]) if argv[0] in _RUN_COMMANDS
                   else _pass_through(_COMMANDS[argv[0]][0]))
        args = argparse.Namespace(handler=handler, rest=argv[1:])
    else:
        args = parser.parse_args(argv)
    console = Console()
    try:
        return int(args.handler(args, console))
    except (_Fail, c.ContractError, c.CapabilityError, ValueError, TypeError) as exc:
        message = " ".join(str(exc).split())
        print(f"error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
