"""The package's shape: no import cycle, dependencies pointing one way between the sub-packages
(and between serve/'s rooms), functions that fit on a screen, collaborators that get typed
objects and keep to their public faces, and only a handful of modules at the top of harness/.

Imports are read with `ast` from every module, wherever they stand (a function-level import
makes a cycle just as well as a module-level one), so nothing is imported to run this test.
"""
from __future__ import annotations

import ast
import graphlib
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "harness"
# bottom first: a package may import its own modules and those of packages before it
LAYERS = ("core", "protocol", "zoo", "matrix", "serve", "eval", "judge", "run", "report", "ci",
          "cli")
TOP_LEVEL_ALLOWED = {"__init__", "pytest_plugin", "pytest_suite"}
# one package per connector and per weather, holding its modules of every layer: a module's
# layer is its role's (a part of its dotted name), any other is core's (facts the matrix reads
# before anything above core is imported)
CONCEPTS = ("connectors", "weathers")
ROLE_LAYERS = {
    "connectors": {"in_server": "serve"},
    "weathers": {"protocol": "protocol", "in_server": "serve", "proxy": "serve",
                 "driver": "run"},
}
# the room of serve/ a concept package's serve-layer role belongs to
ROLE_ROOMS = {"in_server": "plugins", "proxy": "proxy"}
# serve/'s rooms, bottom first; `deploy` (the module at serve/'s top) composes them all
SERVE_ROOMS = ("plugins", "host", "launch", "net", "supervision", "template", "proxy", "deploy")
MAX_FUNCTION_LINES = 80
# `x._name` on another object (a parameter or a local name; not self/cls, not a module): allowed
# where the underscore is public API (namedtuple's) or listed here with the reason
PUBLIC_UNDERSCORE_API = {"_fields", "_asdict", "_replace", "_make"}
PRIVATE_ACCESS_ALLOWED = {
    # argparse lists a parser's actions and groups only through these
    ("harness.cli.run_deployment", "refuse_cell_flags", "parser._action_groups"),
    ("harness.cli.run_deployment", "refuse_cell_flags", "g._group_actions"),
    ("harness.cli.run_deployment", "refuse_cell_flags", "parser._actions"),
    ("harness.cli.run_packed", "child_options", "parser._actions"),
    ("harness.cli.inputs", "given_options", "parser._actions"),
    ("harness.cli.surface", "command_helps", "action._choices_actions"),
    ("harness.cli.surface", "command_helps", "parser._actions"),
    ("harness.cli.surface", "options", "parser._actions"),
    # the xdist_group id suffix, set as pytest-xdist's own loadgroup scheduling sets it
    ("harness.pytest_plugin", "suffix_xdist_groups", "item._id"),
    ("harness.pytest_plugin", "suffix_xdist_groups", "item._nodeid"),
    # Deployment's start-up thread, in Deployment's own module: its cancel flag and lock
    ("harness.serve.deploy", "_run", "d._cancel"),
    ("harness.serve.deploy", "_run", "d._processes_lock"),
    ("harness.serve.deploy", "_run", "d._process"),
    # tokenizers' trained BPE reaches transformers only as its Rust tokenizer object
    ("harness.zoo.random_llama", "build_tokenizer", "bpe._tokenizer"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py")) if "checkpoints" not in p.parts}


# a string that names a harness module ("harness.weathers.calm.driver", or "module:attribute") is an
# import waiting to happen (importlib, entry points): the graph counts it like an import
MODULE_STRING = re.compile(r"harness(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")


def names_not_imports(tree: ast.AST) -> set[int]:
    """ids of the strings that name a module without importing it: the one after ``-m`` in a
    literal argv (run in another process) and a logger's name (``getLogger("harness.x")``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            for before, item in zip(node.elts, node.elts[1:]):
                if isinstance(before, ast.Constant) and before.value == "-m":
                    found.add(id(item))
        elif isinstance(node, ast.Call) and node.args and (
                getattr(node.func, "attr", None) == "getLogger"
                or getattr(node.func, "id", None) == "getLogger"):
            found.add(id(node.args[0]))
    return found


def imports_in(source: str, known: set[str], strings: bool = True) -> set[str]:
    """harness modules `source` imports, at module level or in a function, or (`strings`) names
    in a string (a `from pkg import name` counts pkg.name when that is a module, else pkg)."""
    tree = ast.parse(source)
    launched = names_not_imports(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        elif (strings and isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in launched and MODULE_STRING.fullmatch(node.value)):
            names = [node.value.partition(":")[0]]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def imported_modules(path: Path, known: set[str], strings: bool = True) -> set[str]:
    return imports_in(path.read_text(), known, strings)


def import_graph(strings: bool = True) -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    graph = {}
    for name, path in mods.items():
        deps = imported_modules(path, known, strings) - {name}
        # a package's __init__ is imported on the way to any of its modules: not an edge of its own
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    return graph


def role_of(module: str) -> str | None:
    """The role of a concept package's module ("in_server", "driver"...), or None."""
    parts = module.split(".")
    if len(parts) < 3 or parts[1] not in CONCEPTS:
        return None
    roles = ROLE_LAYERS[parts[1]]
    return next((part for part in parts[3:] if part in roles), None)


def package_of(module: str) -> str | None:
    """The layer of `module`: its package's, or for a concept package's module its role's."""
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in CONCEPTS:
        role = role_of(module)
        return ROLE_LAYERS[parts[1]][role] if role else "core"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def test_a_concept_packages_modules_take_their_roles_layers():
    assert package_of("harness.connectors") == package_of("harness.connectors.nixl") == "core"
    assert package_of("harness.connectors.nixl.in_server.idle") == "serve"
    assert serve_room_of("harness.connectors.nixl.in_server.idle") == "plugins"
    assert package_of("harness.weathers.expiry.driver") == "run"
    assert package_of("harness.weathers.expiry.protocol") == "protocol"
    assert package_of("harness.weathers.aborts.proxy") == "serve"
    assert serve_room_of("harness.weathers.aborts.proxy") == "proxy"
    assert package_of("harness.run.weather") == "run"


def test_reader_sees_real_imports():
    graph = import_graph()
    assert "harness.core.outcomes" in graph["harness.judge.verdict"]
    assert "harness.cli.run" in graph["harness.cli.main"]
    assert "harness.protocol.kv_digest" in graph["harness.cli.inputs"]    # in a function


def test_reader_sees_imports_by_string_and_not_processes():
    known = set(modules())
    lazy = "def f():\n    import harness.run.record\n"
    by_string = "import importlib\nM = importlib.import_module('harness.weathers.calm.driver')\n"
    entry = "ENTRY = 'harness.serve.plugins.faults.decode:register'\n"
    launched = "ARGV = ['python', '-m', 'harness.cli', 'run']\n"
    logger = "import logging\nlog = logging.getLogger('harness.serve.proxy.app')\n"
    assert imports_in(lazy, known) == {"harness.run.record"}
    assert imports_in(by_string, known) == {"harness.weathers.calm.driver"}
    assert imports_in(entry, known) == {"harness.serve.plugins.faults.decode"}
    assert imports_in(launched, known) == imports_in(logger, known) == set()


def test_no_import_cycle():
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_dependencies_point_down():
    wrong = []
    for module, deps in import_graph().items():
        pkg = package_of(module)
        if pkg is None:
            continue
        for dep in deps:
            dep_pkg = package_of(dep)
            if dep_pkg is not None and LAYERS.index(dep_pkg) > LAYERS.index(pkg):
                wrong.append(f"{module} imports {dep} ({pkg} may not depend on {dep_pkg})")
    assert not wrong, "\n".join(sorted(wrong))


# packages that judge or show what ran and need none of the machinery that ran it: what the
# servers wrote reaches them through harness.protocol
NOT_ON_SERVE = ("eval", "judge", "report")


def test_judging_and_reporting_import_nothing_of_serve():
    wrong = sorted(f"{module} imports {dep}" for module, deps in import_graph().items()
                   if package_of(module) in NOT_ON_SERVE for dep in deps
                   if package_of(dep) == "serve")
    assert not wrong, "\n".join(wrong)


def test_the_recorder_judges_nothing():
    """run/record.py stores the verdict it is given: nothing of judge/ to judge it again with."""
    assert not [dep for dep in import_graph()["harness.run.record"] if package_of(dep) == "judge"]


def serve_room_of(module: str) -> str | None:
    parts = module.split(".")
    if role_of(module) in ROLE_ROOMS:
        return ROLE_ROOMS[role_of(module)]
    return parts[2] if len(parts) > 2 and parts[1] == "serve" else None


def test_serve_rooms_depend_downwards():
    wrong = []
    for module, deps in import_graph().items():
        room = serve_room_of(module)
        if room is None:
            continue
        for dep in deps:
            dep_room = serve_room_of(dep)
            if dep_room is not None and SERVE_ROOMS.index(dep_room) > SERVE_ROOMS.index(room):
                wrong.append(f"{module} imports {dep} ({room} may not depend on {dep_room})")
    assert not wrong, "\n".join(sorted(wrong))


def test_every_serve_module_is_in_a_room():
    rooms = {p.stem if p.is_file() else p.name for p in (ROOT / "serve").iterdir()
             if p.name != "__init__.py" and p.name != "__pycache__"}
    assert rooms == set(SERVE_ROOMS)


def test_the_protocol_needs_nothing_but_the_standard_library_and_core():
    """Reading what a server wrote must not load what runs inside one (vLLM, torch, numpy)."""
    wrong = []
    for name, path in modules().items():
        if package_of(name) != "protocol":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module]
            else:
                continue
            wrong += [f"{name} imports {top}" for top in tops
                      if top.split(".")[0] not in sys.stdlib_module_names
                      and top != "harness.core" and not top.startswith(("harness.core.",
                                                                         "harness.protocol"))]
    assert not wrong, "\n".join(wrong)


def vllm_plugin_modules() -> set[str]:
    """The modules pyproject.toml hands vLLM as general plugins (entry points)."""
    project = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())
    return {value.split(":")[0]
            for value in project["project"]["entry-points"]["vllm.general_plugins"].values()}


def in_server_modules() -> set[str]:
    """What vLLM loads inside its servers: serve/plugins/, a connector's or weather's in-server
    part and every general plugin."""
    return ({m for m in modules() if m.startswith("harness.serve.plugins")
             or role_of(m) == "in_server"} | vllm_plugin_modules())


def test_every_vllm_plugin_entry_point_is_a_module_here():
    missing = sorted(vllm_plugin_modules() - set(modules()))
    assert not missing, f"pyproject.toml hands vLLM plugins that do not exist: {missing}"


def test_only_the_servers_import_a_plugin():
    """The harness reads what the in-server plugins write through harness.protocol: a plugin
    module imported outside the servers would load vLLM-side code to parse a line. (Names in
    strings load nothing: doctor's table of which module attaches a hook names plugins.)"""
    inside = in_server_modules()
    statements = import_graph(strings=False)
    wrong = sorted(f"{module} imports {dep}" for module, deps in statements.items()
                   if module not in inside for dep in deps if dep in inside)
    assert not wrong, "plugin modules imported outside the servers:\n" + "\n".join(wrong)


def test_every_subpackage_has_a_layer():
    pkgs = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert pkgs == set(LAYERS) | set(CONCEPTS)


def functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_function_needs_a_scroll():
    long = {f"{name}:{fn.name}": n for name, path in modules().items()
            for fn in functions(ast.parse(path.read_text()))
            if (n := fn.end_lineno - fn.lineno + 1) > MAX_FUNCTION_LINES}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def imported_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def private_reaches(source: str, module: str) -> set[tuple[str, str, str]]:
    """(module, function, `x._name`) for each private attribute a function reads or sets on
    another object: a parameter or local name other than self/cls and imported modules."""
    tree = ast.parse(source)
    modules_ = imported_names(tree) | {"self", "cls"}
    found = set()
    for fn in functions(tree):
        for node in ast.walk(fn):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id not in modules_ and node.attr.startswith("_")
                    and not node.attr.startswith("__") and node.attr not in PUBLIC_UNDERSCORE_API):
                found.add((module, fn.name, f"{node.value.id}.{node.attr}"))
    return found


def test_the_private_reach_check_sees_a_collaborator_reaching_in():
    source = "def start_ahead(runner, cells):\n    return runner._plan_group(cells)\n"
    assert private_reaches(source, "m") == {("m", "start_ahead", "runner._plan_group")}
    local = "def run(self):\n    d = self.deployment\n    return d._cancel\n"
    assert private_reaches(local, "m") == {("m", "run", "d._cancel")}
    assert private_reaches("import os\ndef f(self):\n    os._exit(self._x)\n", "m") == set()


def test_no_function_reaches_into_another_objects_private_attributes():
    # vLLM's plugins patch vLLM's own objects: reading its internals is what they are for
    inside = in_server_modules()
    found = set().union(*(private_reaches(path.read_text(), name)
                          for name, path in modules().items() if name not in inside))
    wrong = sorted(found - PRIVATE_ACCESS_ALLOWED)
    assert not wrong, f"private attributes of another object: {wrong}"
    stale = sorted(PRIVATE_ACCESS_ALLOWED - found)
    assert not stale, f"allowed but no longer there: {stale}"


def test_run_collaborators_are_typed():
    """run/'s collaborators get typed objects: no named parameter there is annotated `Any`."""
    untyped = [f"{name}:{fn.name}({a.arg})" for name, path in modules().items()
               if name.startswith("harness.run.")
               for fn in functions(ast.parse(path.read_text()))
               for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
               if a.annotation is not None and ast.unparse(a.annotation) in ("Any", "'Any'")]
    assert not untyped, f"parameters typed Any in run/: {untyped}"


# run/ by stage (plan, evaluation, evidence, record...): a newcomer reads a dozen names, not 30
RUN_TOP_LEVEL_MAX = 12


def test_run_is_split_by_stage():
    run = ROOT / "run"
    top = ({p.stem for p in run.glob("*.py") if p.stem != "__init__"}
           | {p.name for p in run.iterdir() if (p / "__init__.py").exists()})
    assert len(top) <= RUN_TOP_LEVEL_MAX, sorted(top)


def test_the_design_doc_names_every_package_and_run_and_protocol_entry():
    """docs/design.md's layout table follows the tree: a package, a module of core/, a room of
    run/ or protocol/, or a connector's or weather's package that it does not name is one a
    newcomer cannot find there."""
    text = (ROOT.parent / "docs" / "design.md").read_text()
    names = [f"harness/{pkg}/" for pkg in LAYERS + CONCEPTS]
    names += [p.stem for p in (ROOT / "core").glob("*.py") if p.stem != "__init__"]
    for pkg in ("run", "protocol") + CONCEPTS:
        folder = ROOT / pkg
        names += [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
        names += [f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").exists()]
    missing = [name for name in names if f"`{name}`" not in text]
    assert not missing, f"docs/design.md does not name: {missing}"


def test_few_modules_at_the_top():
    top = {p.stem for p in ROOT.glob("*.py")}
    assert top <= TOP_LEVEL_ALLOWED, f"modules at the top of harness/: {sorted(top - TOP_LEVEL_ALLOWED)}"


def test_no_import_error_fallback_around_own_modules():
    """`try: from harness... except ImportError` can only hide a real import error."""
    offenders = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Try):
                continue
            catches = any(isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                          for h in node.handlers)
            own = any(isinstance(n, (ast.Import, ast.ImportFrom))
                      and any((getattr(n, "module", None) or "").startswith("harness")
                              or a.name.startswith("harness") for a in n.names)
                      for stmt in node.body for n in ast.walk(stmt))
            if catches and own:
                offenders.append(f"{name}:{node.lineno}")
    assert not offenders, f"ImportError fallbacks around harness's own modules: {offenders}"
