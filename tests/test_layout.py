"""The layout's rules, read from the code's own imports (lazy ones inside functions included): the layers are
matrix < suites < sessions < reports (LAYERS), each package imports only its own layer and those below it, no
module takes another module's private name, and no modules import each other in a loop; no module of any package
is over LONGEST_MODULE lines and no function over LONGEST_FUNCTION."""

import ast
from pathlib import Path

import pytest

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
pages from the archive alone (atlas) < the verbs of `python -m reports` (commands). A room imports itself and the rooms
before it; other rooms import a room's package (its `__init__`'s public names), never its inner modules."""
SUITES_ROOMS = ("base", "verdicts", "checks", "variants", "reference", "engine", "records", "run")
"""suites/ in rooms along the chain its imports want (suites/__init__.py says why each sits where it does): what
knows nothing of cells (base) < the words of a verdict and a cause (verdicts) < what a cell measures and how it is
judged (checks) < how a variant loads, quantizes or trains (variants) < the unsharded reference (reference) < the rank
groups (engine) < what a run writes (records) < a cell from the pytest process (run). Other rooms import a suites
room's modules directly: a rank or the reference process imports only the modules it needs, so a room's `__init__`
re-exports nothing (the fork server's start-up cost is what it imports)."""
ROOMS = {"reports": REPORTS_ROOMS, "suites": SUITES_ROOMS}
ROOTS = {"reports", "reports.__main__", "suites", "suites.test_autotp"}
"""The packages themselves, reports' command line and the suites' pytest file (`pytest suites` collects it); every
other module of a package in ROOMS is in a room."""


def room_of(module: str) -> str | None:
    parts = module.split(".")
    rooms = ROOMS.get(parts[0], ())
    return parts[1] if len(parts) > 1 and parts[1] in rooms else None


def room_index(module: str) -> int:
    room = room_of(module)
    assert room is not None
    return ROOMS[module.split(".")[0]].index(room)


def test_every_module_of_a_package_in_rooms_is_in_a_room():
    for package, rooms in ROOMS.items():
        inside = [module for module in harness_imports() if module.split(".")[0] == package and module not in ROOTS]
        assert [module for module in inside if room_of(module) is None] == []
        assert {room_of(module) for module in inside} == set(rooms)


def test_rooms_import_only_themselves_and_the_rooms_before_them():
    upward = [
        f"{module} ({room_of(module)}) imports {target} ({room_of(target)})"
        for module, imports in harness_imports().items()
        if room_of(module)
        for target, _ in imports
        if room_of(target) and target.split(".")[0] == module.split(".")[0] and room_index(target) > room_index(module)
    ]
    assert upward == []


def test_the_room_test_sees_an_arrow_back_up():
    """A lazy import from a lower room into a higher one (the kind the rooms removed) is seen as one."""
    assert room_index("suites.reference.unsharded") > room_index("suites.variants.loading")
    assert room_of("suites.test_autotp") is None and room_of("suites.run.driver") == "run"
    assert any(target == "suites.run.driver" for target, _ in harness_imports()["suites.test_autotp"])


def test_other_rooms_import_a_rooms_package_not_its_modules():
    """What a reports room offers is its `__init__`'s names: the modules behind them can move inside the room."""
    reaching_in = [
        f"{module} imports {target}"
        for module, imports in harness_imports().items()
        for target, _ in imports
        if target.startswith("reports.")
        and room_of(target)
        and target != f"reports.{room_of(target)}"
        and room_of(module) != room_of(target)
    ]
    assert reaching_in == []


def test_no_suites_room_reexports_a_name():
    """A suites room's `__init__` is its docstring alone: one import path per name, and nothing imported in a rank
    that the rank does not use."""
    reexporting = [
        f"suites/{room}/__init__.py"
        for room in SUITES_ROOMS
        if any(
            isinstance(node, (ast.Import, ast.ImportFrom))
            for node in ast.walk(ast.parse((PROJECT_ROOT / "suites" / room / "__init__.py").read_text()))
        )
    ]
    assert reexporting == []


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
WHOLE_BY_DESIGN = {"suites/records/repro_template.py"}
"""Not a module one reads in the harness: the standalone repro script's source, which suites/records/repro.py writes
out whole as `repro_<cell>.py`, one file a DeepSpeed maintainer runs alone (its functions are bounded like any)."""


def files_of(name: str) -> list[Path]:
    """The Python files of a package or folder of the harness, or the one file `name` (noxfile.py, conftest.py)."""
    return [PROJECT_ROOT / name] if name.endswith(".py") else sorted((PROJECT_ROOT / name).rglob("*.py"))


def harness_files() -> list[Path]:
    return sorted(path for name in SIZED for path in files_of(name))


def too_long() -> dict[str, int]:
    """`path` (a module over LONGEST_MODULE) or `path:function` (a function over LONGEST_FUNCTION) -> its lines."""
    found = {}
    for path in harness_files():
        name = path.relative_to(PROJECT_ROOT).as_posix()
        text = path.read_text()
        if (lines := len(text.splitlines())) > LONGEST_MODULE and name not in WHOLE_BY_DESIGN:
            found[name] = lines
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (lines := node.end_lineno - node.lineno + 1) > LONGEST_FUNCTION:
                    found[f"{name}:{node.name}"] = lines
    return found


def test_no_module_or_function_is_longer_than_its_bound():
    assert [f"{where}: {lines} lines" for where, lines in too_long().items()] == []


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


LAZY_BY_DESIGN = {"suites/records/repro_template.py", "matrix/checkpoints.py:randomise_constant_parameters"}
"""Text that is an output: the repro script's template (written out whole) and a function whose source the repro
script embeds (suites/records/repro.py); each keeps its imports where the standalone script needs them, and a comment
added there would change every repro script written."""
LAZY_RULED = SIZED
"""Every package, the benchmarks' scripts, the noxfile and conftest.py."""


def unexplained_lazy_imports(package: str) -> list[str]:
    """`path:line` of each import inside a function of `package` that says nowhere why it is not at the top of its
    module: a comment on the import's lines or on the line above the block of imports it is in (the top is the
    default; an import inside a function costs the reader a question a comment answers once: a module that must not
    import torch, an optional dependency, a measured start-up cost)."""
    unexplained = []
    for path in files_of(package):
        name = path.relative_to(PROJECT_ROOT).as_posix()
        if name in LAZY_BY_DESIGN:
            continue
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse("\n".join(lines), str(path))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if f"{name}:{function.name}" in LAZY_BY_DESIGN:
                continue
            for body in (getattr(node, field, None) for node in ast.walk(function) for field in ("body", "orelse")):
                block_start = None
                for statement in body if isinstance(body, list) else ():
                    if not isinstance(statement, (ast.Import, ast.ImportFrom)):
                        block_start = None
                        continue
                    block_start = block_start or statement.lineno
                    if not any("#" in line for line in lines[block_start - 2 : statement.end_lineno]):
                        unexplained.append(f"{name}:{statement.lineno}")
    return sorted(set(unexplained))


@pytest.mark.parametrize("package", LAZY_RULED)
def test_a_lazy_import_says_why(package):
    assert unexplained_lazy_imports(package) == []


def test_the_lazy_import_rule_sees_an_unexplained_one(tmp_path, monkeypatch):
    (tmp_path / "matrix").mkdir()
    (tmp_path / "matrix" / "lazy.py").write_text(
        "def f():\n    import os\n\n    import torch\n\n\n"
        "def g():\n    # torch behind it\n    import os\n    from matrix import cells\n"
    )
    monkeypatch.setitem(globals(), "PROJECT_ROOT", tmp_path)
    assert unexplained_lazy_imports("matrix") == ["matrix/lazy.py:2", "matrix/lazy.py:4"]


@pytest.mark.parametrize("top_file", ["noxfile.py", "conftest.py"])
def test_the_lazy_import_rule_sees_the_noxfile_and_conftest(tmp_path, monkeypatch, top_file):
    assert top_file in LAZY_RULED
    (tmp_path / top_file).write_text("def f():\n    import os\n\n\ndef g():\n    import os  # lazily: a reason\n")
    monkeypatch.setitem(globals(), "PROJECT_ROOT", tmp_path)
    assert unexplained_lazy_imports(top_file) == [f"{top_file}:2"]


def test_the_lazy_import_rule_spares_only_the_repro_scripts_text(tmp_path, monkeypatch):
    """The exemptions name real places: a renamed function or moved template would silently widen them."""
    for where in LAZY_BY_DESIGN:
        path, _, function = where.partition(":")
        text = (PROJECT_ROOT / path).read_text()
        assert not function or f"def {function}(" in text
