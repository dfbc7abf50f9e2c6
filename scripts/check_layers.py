#!/usr/bin/env python3
"""Check the layering of DESIGN.md §1 by reading imports (nothing is executed).

Vendored from the shared reference tools (shared/tools/check_layers.py) so CI always runs it.

contracts <- verification <- executors <- mixle_parallel: a layer may import only layers to its
left. contracts/ and the facade import no heavy engine at module level. Modules over 600 lines
are listed as candidates to split. Usage: python scripts/check_layers.py [PROJECT_ROOT]
Exit status 1 when a layering rule is broken.
"""
import ast
import sys
from pathlib import Path

LAYERS = ["contracts", "verification", "executors", "mixle_parallel"]
HEAVY = {"torch", "mpi4py", "pyspark", "dask", "distributed", "ray", "lightning", "megatron"}


def layer_of_module(name: str):
    parts = name.split(".")
    if parts[0] == "mixle_parallel":
        return parts[1] if len(parts) > 1 and parts[1] in LAYERS[:3] else "mixle_parallel"
    return parts[0] if parts[0] in LAYERS[:3] else None


def resolve_relative(root: Path, path: Path, level: int, module: str | None) -> str:
    """The dotted name a relative import in ``path`` reaches: the layer folders are siblings on disk, as the
    subpackages of ``mixle_parallel`` are once installed, so ``..contracts`` from ``executors/x.py`` is contracts."""
    package = list(path.relative_to(root).parent.parts)
    base = package[: len(package) - level + 1]
    return ".".join(base + ([module] if module else [])) or "mixle_parallel"


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    broken, heavy, big = [], [], []
    for layer in LAYERS:
        folder = root / layer
        if not folder.is_dir():
            continue
        rank = LAYERS.index(layer)
        for path in sorted(folder.rglob("*.py")):
            text = path.read_text(encoding="utf-8", errors="replace")
            lines = text.count("\n")
            if lines > 600:
                big.append(f"{path.relative_to(root)} ({lines} lines)")
            try:
                tree = ast.parse(text)
            except SyntaxError as err:
                broken.append(f"{path.relative_to(root)}: does not parse ({err.msg})")
                continue
            top_level = {id(n) for n in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif isinstance(node, ast.ImportFrom) and node.level:
                    names = [resolve_relative(root, path, node.level, node.module)]
                else:
                    continue
                for name in names:
                    target = layer_of_module(name)
                    if target and LAYERS.index(target) > rank:
                        where = f"{path.relative_to(root)}:{node.lineno}"
                        broken.append(f"{where}: {layer} imports {name} (a layer above it)")
                    if layer in ("contracts", "mixle_parallel") and id(node) in top_level \
                            and name.split(".")[0] in HEAVY:
                        heavy.append(f"{path.relative_to(root)}:{node.lineno}: module-level import of {name}")
    for title, rows in (("layering broken", broken), ("heavy import at module level", heavy),
                        ("modules over 600 lines (consider splitting)", big)):
        if rows:
            print(f"{title}:")
            for row in rows:
                print(f"  {row}")
    if not (broken or heavy or big):
        print("layers hold: contracts <- verification <- executors <- mixle_parallel")
    return 1 if (broken or heavy) else 0


if __name__ == "__main__":
    sys.exit(main())
