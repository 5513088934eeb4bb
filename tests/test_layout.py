"""The layout's rules, read from the code's own imports (lazy ones inside functions included): the layers are
matrix < suites < sessions < reports (LAYERS), each package imports only its own layer and those below it, no
module takes another module's private name, and no modules import each other in a loop."""

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
LONGEST_REPORTS_MODULE = 500


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


def test_no_reports_module_is_longer_than_a_screenful_of_screens():
    long = [
        f"{path.relative_to(PROJECT_ROOT)}: {lines} lines"
        for path in sorted((PROJECT_ROOT / "reports").rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > LONGEST_REPORTS_MODULE
    ]
    assert long == []
