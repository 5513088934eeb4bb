"""The layout's rules, read from the code's own imports (lazy ones inside functions included): the layers are
matrix < suites < sessions < reports (LAYERS), each package imports only its own layer and those below it, no
module takes another module's private name, and no modules import each other in a loop; no module of any package
is over LONGEST_MODULE lines and no function over LONGEST_FUNCTION."""

import ast
from pathlib import Path

from matrix import PROJECT_ROOT

LAYERS = {"matrix": 0, "suites": 1, "sessions": 2, "reports": 3}
"""A package may import its own layer and those below (sessions runs suites; reports re-runs cells for bisection)."""


def harness_imports() -> dict[str, list[tuple[str, list[str]]]]:
    """module → [(imported module, names taken from it)] for every harness module."""
    found = {}
    for package in LAYERS:
        for path in (PROJECT_ROOT / package).rglob("*.py"):
            module = ".".join(path.relative_to(PROJECT_ROOT).with_suffix("").parts).removesuffix(".__init__")
            imports = []
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    imports.append((node.module, [alias.name for alias in node.names]))
                elif isinstance(node, ast.Import):
                    imports.extend((alias.name, []) for alias in node.names)
            found[module] = [(target, names) for target, names in imports if target.split(".")[0] in LAYERS]
    return found


def test_each_package_imports_only_its_own_layer_and_those_below():
    upward = [
        f"{module} imports {target}"
        for module, imports in harness_imports().items()
        for target, _ in imports
        if LAYERS[target.split(".")[0]] > LAYERS[module.split(".")[0]]
    ]
    assert upward == []


def test_no_private_name_crosses_a_module():
    private = [
        f"{module} takes {target}.{name}"
        for module, imports in harness_imports().items()
        for target, names in imports
        for name in names
        if name.startswith("_") and target != module
    ]
    assert private == []


def test_no_modules_import_each_other_in_a_loop():
    graph = harness_imports()
    modules = set(graph)
    # `from package import module` depends on that module; `from module import name` on the module
    edges = {
        module: {f"{t}.{n}" if f"{t}.{n}" in modules else t for t, names in imports for n in (names or [""])}
        & modules - {module}
        for module, imports in graph.items()
    }
    state, loops = {}, []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                loops.append(
                    " → ".join(path[path.index(target) :] + [module, target])
                    if target in path
                    else f"{module} → {target}"
                )
            elif target not in state:
                visit(target, path + [module])
        state[module] = "done"

    for module in sorted(modules):
        if module not in state:
            visit(module, [])
    assert loops == []


def test_the_layout_test_sees_the_whole_harness():
    modules = harness_imports()
    assert {"matrix.cells", "sessions.environments", "suites.engine.rank_group", "reports.search.triage"} <= set(
        modules
    )
    assert any(
        target == "suites.engine.cell_runner" for target, _ in modules["suites.engine.worker"]
    )  # a lazy import counts
    assert Path(PROJECT_ROOT / "tests").is_dir()


REPORTS_ROOMS = ("store", "clones", "analysis", "search", "outputs", "atlas", "commands")
"""reports/ in rooms along its chain: what was recorded (store) < what a library's clone says (clones) < what the
history means (analysis) < which release/commit changed a cell (search) < what people read (outputs) < the atlas's
pages from the archive alone (atlas) < the verbs of `python -m reports` (commands). A room imports itself and the rooms before it; other rooms import a room's package
(its `__init__`'s public names), never its inner modules."""
REPORTS_ROOTS = {"reports", "reports.__main__"}
"""The package (ReportsError, which every room raises) and the command line; every other module is in a room."""


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "reports" and len(parts) > 1 and parts[1] in REPORTS_ROOMS else None


def test_every_reports_module_is_in_a_room():
    outside = [module for module in harness_imports() if module.startswith("reports") and module not in REPORTS_ROOTS]
    assert [module for module in outside if room_of(module) is None] == []
    assert {room_of(module) for module in outside} == set(REPORTS_ROOMS)


def test_rooms_import_only_themselves_and_the_rooms_before_them():
    upward = [
        f"{module} ({room_of(module)}) imports {target} ({room_of(target)})"
        for module, imports in harness_imports().items()
        if room_of(module)
        for target, _ in imports
        if room_of(target) and REPORTS_ROOMS.index(room_of(target)) > REPORTS_ROOMS.index(room_of(module))
    ]
    assert upward == []


def test_other_rooms_import_a_rooms_package_not_its_modules():
    """What a room offers is its `__init__`'s names: the modules behind them can move inside the room."""
    reaching_in = [
        f"{module} imports {target}"
        for module, imports in harness_imports().items()
        for target, _ in imports
        if room_of(target) and target != f"reports.{room_of(target)}" and room_of(module) != room_of(target)
    ]
    assert reaching_in == []


def test_no_room_exports_a_name_that_hides_one_of_its_modules():
    """`from reports.outputs import publish` must not be a function one day and the module the next."""
    hiding = [
        f"reports.{room}.{name}"
        for room in REPORTS_ROOMS
        for name in getattr(__import__(f"reports.{room}", fromlist=["__all__"]), "__all__", [])
        if (PROJECT_ROOT / "reports" / room / f"{name}.py").exists()
    ]
    assert hiding == []


LONGEST_MODULE = 500
"""Lines a module of the harness may have: past it, it holds more than one thing (one module per rule, a folder per
domain)."""
LONGEST_FUNCTION = 80
"""Lines a function (or method) may have, its decorators aside: past it, its steps want names of their own."""
SIZED = (*LAYERS, "benchmarks", "noxfile.py", "conftest.py")
"""Every package, the benchmarks' scripts, the noxfile and conftest.py."""
TOO_LONG_FOR_NOW = {
    "suites/reference.py": "module: the unsharded reference, its process and its offload (house-rooms splits it)",
    "suites/records/repro_template.py": "module: the repro script's template (house-rooms splits it)",
    "suites/checks/memory.py": "module: the memory check and its split rules (house-rooms splits it)",
    "suites/variants/training.py": "module: the training rows' engine and comparison (house-rooms splits it)",
    "suites/memory_plan.py": "module: the memory plan of every process (house-rooms splits it)",
    "suites/checks/training.py:check_model": "function: the training checks of one cell (house-rooms splits it)",
    "suites/engine/cell_runner.py:run_on_rank": "function: one cell on one rank (house-rooms splits it)",
}
"""Modules and functions of suites/ still over the bounds, each with why and who shrinks it; it only ever shrinks: an
entry that fits (or is gone) fails the test until it is removed here."""


def harness_files() -> list[Path]:
    return sorted(
        path
        for name in SIZED
        for path in ([PROJECT_ROOT / name] if name.endswith(".py") else (PROJECT_ROOT / name).rglob("*.py"))
    )


def too_long() -> dict[str, int]:
    """`path` (a module over LONGEST_MODULE) or `path:function` (a function over LONGEST_FUNCTION) → its lines."""
    found = {}
    for path in harness_files():
        name = path.relative_to(PROJECT_ROOT).as_posix()
        text = path.read_text()
        if (lines := len(text.splitlines())) > LONGEST_MODULE:
            found[name] = lines
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (lines := node.end_lineno - node.lineno + 1) > LONGEST_FUNCTION:
                    found[f"{name}:{node.name}"] = lines
    return found


def test_no_module_or_function_is_longer_than_its_bound():
    found = too_long()
    assert [f"{where}: {lines} lines" for where, lines in found.items() if where not in TOO_LONG_FOR_NOW] == []
    assert [where for where in TOO_LONG_FOR_NOW if where not in found] == [], "fits now: remove it from the list"


def test_the_size_bounds_see_every_package_and_catch_a_long_one(tmp_path, monkeypatch):
    seen = {path.relative_to(PROJECT_ROOT).parts[0] for path in harness_files()}
    assert seen == set(SIZED)
    planted = tmp_path / "matrix" / "planted.py"
    planted.parent.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(LONGEST_FUNCTION))
    planted.write_text(f"def long():\n{body}" + "\n" * (LONGEST_MODULE - LONGEST_FUNCTION))
    monkeypatch.setitem(globals(), "PROJECT_ROOT", tmp_path)
    monkeypatch.setitem(globals(), "SIZED", ("matrix",))
    assert too_long() == {"matrix/planted.py": LONGEST_MODULE + 1, "matrix/planted.py:long": LONGEST_FUNCTION + 1}
