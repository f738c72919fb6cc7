"""What a vLLM release offers each hook of the compatibility table, read from its wheel's source.

    python scripts/vllm_hook_shapes.py VLLM_WHEEL [TORCH_WHEEL] > tests/data/vllm_hook_shapes/RELEASE.json

For every need of `harness.core.vllm_hooks.hooks()` (each alternative of an `any_of`) it parses the
module's source with `ast` (nothing is imported: a CUDA wheel cannot be imported on a CPU
machine) and writes whether the dotted attribute exists and, for a function, its parameter
names. `tests/serve/test_vllm_hook_shapes.py` builds fake modules of exactly that shape and asks
the table and the hooks' own attach logic what they make of them, so a release's shape is tested
without the release. Needs in packages the wheels do not hold (NIXL's compiled bindings) are
listed as "not in these wheels".
"""
from __future__ import annotations

import ast
import json
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.core.vllm_hooks import AnyOf, hooks  # noqa: E402


def _sources(wheels: list[str]) -> dict[str, str]:
    """module dotted name -> source text, for every .py file of the wheels."""
    out = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.endswith(".py"):
                    module = name[:-3].replace("/", ".")
                    module = module[: -len(".__init__")] if module.endswith(".__init__") else module
                    out[module] = z.read(name).decode("utf-8", "replace")
    return out


def _params(node: ast.AST) -> list[str]:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    if args.vararg:
        names.append("*" + args.vararg.arg)
    if args.kwarg:
        names.append("**" + args.kwarg.arg)
    return names


def _find(body: list[ast.stmt], part: str) -> ast.AST | None:
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == part:
            return node
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                return node
        if isinstance(node, (ast.ImportFrom, ast.Import)):
            if any((alias.asname or alias.name.split(".")[0]) == part for alias in node.names):
                return node
    return None


def _star_imports(tree: ast.Module, module: str) -> list[str]:
    """The modules `module` star-imports (relative ones resolved against its package)."""
    out = []
    for node in ast.walk(tree):      # also under `if is_available():` (torch.distributed)
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            base = module.split(".")[: len(module.split(".")) - node.level + 1] if node.level else []
            out.append(".".join([*base, node.module] if node.module else base))
    return out


def shape_of(sources: dict[str, str], module: str, path: str) -> dict:
    """{"exists": bool, "kind": ..., "params": [...]} of `module`'s attribute `path`."""
    if module not in sources:
        return {"exists": False, "why": f"no module {module} in these wheels"}
    tree = ast.parse(sources[module])
    node: ast.AST = tree
    parts = [p for p in path.split(".") if p]
    for i, part in enumerate(parts):
        found = _find(getattr(node, "body", []), part)
        if found is None and node is tree:     # a package re-exporting with `from .x import *`
            for star in _star_imports(tree, module):
                shape = shape_of(sources, star, ".".join(parts[i:]))
                if shape.get("exists"):
                    return shape
        if found is None:
            return {"exists": False, "why": f"{module} has no {path}"}
        node = found
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {"exists": True, "kind": "function", "params": _params(node)}
    return {"exists": True, "kind": type(node).__name__}


def main(argv: list[str]) -> int:
    sources = _sources(argv)
    release = next((Path(w).name.split("-")[1] for w in argv if Path(w).name.startswith("vllm-")), "?")
    table = {}
    for row in hooks():
        needs = []
        for need in row.needs:
            for alt in (need.needs if isinstance(need, AnyOf) else (need,)):
                top = alt.module.split(".")[0]
                shape = (shape_of(sources, alt.module, alt.path)
                         if any(m == top or m.startswith(top + ".") for m in sources)
                         else {"exists": None, "why": f"{top} is not in these wheels"})
                needs.append({"module": alt.module, "path": alt.path, **shape})
        table[row.name] = needs
    json.dump({"vllm": release, "wheels": [Path(w).name for w in argv], "hooks": table},
              sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
