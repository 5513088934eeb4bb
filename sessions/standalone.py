"""`nox -s repro -- --standalone <script or cell id>`: a standalone script (a repro script the harness wrote, or the
minimal script of a draft issue) run as its reader runs it, `deepspeed --num_gpus <tp> <script>`, with the launcher and
python of the combination's environment, in an empty folder, with nothing of the harness on the path.

Run by the combination's python (`python -m sessions.standalone`), so `deepspeed` is that environment's own launcher
(sessions/environments.py gives a combination its lower layers' launchers): its ranks import the same DeepSpeed,
transformers and torch the cells ran on."""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from suites.engine.rank_group import free_port

CELL_TP = re.compile(r"-tp(\d+)(?:\.py)?$")
"""A cell id's tp (`llama.faithful-eager-fp32-tp3`), and a repro script's named after its cell."""


class StandaloneError(ValueError):
    """What was asked for cannot be run; the message says what to do."""


def script_of(target: str, results: Path) -> Path:
    """The script `target` names: a file, or a cell id whose repro script render wrote under results/repro/."""
    path = Path(target)
    if path.is_file():
        return path
    written = results / "repro" / f"repro_{target}.py"
    if written.is_file():
        return written
    if path.suffix == ".py" or os.sep in target:
        raise StandaloneError(f"{target}: no such file")
    raise StandaloneError(
        f"{target}: neither a file nor a cell with a repro script in {written.parent}/; `nox -s repro -- --models "
        f"<model> --tp <tp>` runs a cell and writes its script"
    )


def ranks_of(script: Path) -> int:
    """The ranks the script was written for: its cell's tp (the CELL literal of a repro script), else the tp its file
    name ends with."""
    try:
        module = ast.parse(script.read_text(), filename=str(script))
    except (SyntaxError, UnicodeDecodeError) as error:
        raise StandaloneError(f"{script}: not a Python script ({error})") from None
    for node in module.body:
        targets: list[ast.expr] = [node.target] if isinstance(node, ast.AnnAssign) else []
        if isinstance(node, ast.Assign):
            targets = node.targets
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if value is not None and [getattr(target, "id", "") for target in targets] == ["CELL"]:
            try:
                cell = ast.literal_eval(value)
            except (ValueError, TypeError, RecursionError):  # not a literal
                break
            tp = cell.get("tp") if isinstance(cell, dict) else None
            if isinstance(tp, int) and tp > 0:
                return tp
    if named := CELL_TP.search(script.name):
        return int(named.group(1))
    raise StandaloneError(f"{script}: its ranks are not written in it; pass --ranks N")


def run_standalone(script: Path, ranks: int, launcher: Path) -> int:
    """The script's exit status, run by `launcher` on `ranks` ranks in an empty folder, its output streamed."""
    with tempfile.TemporaryDirectory(prefix="autotp-standalone-") as folder:
        shutil.copy(script, Path(folder) / script.name)
        env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
        command = [str(launcher), "--num_gpus", str(ranks), "--master_port", str(free_port()), script.name]
        # As the script's command says (suites/records/run_records.py `launcher_command`): no numactl needed.
        env |= {"LOCAL_SIZE": str(ranks), "PYTHONUNBUFFERED": "1"}
        print(f"$ LOCAL_SIZE={ranks} {' '.join(command[:-1])} {script}", flush=True)
        return subprocess.run(command, cwd=folder, env=env, check=False).returncode


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="nox -s repro -- --standalone", description="run a standalone script with this environment's launcher"
    )
    parser.add_argument("target", help="a script, or a cell id whose repro script is under RESULTS/repro/")
    parser.add_argument("--ranks", type=int, help="ranks to launch (default: the script's cell's tp)")
    parser.add_argument("--results", default="results", help="where render wrote the repro scripts")
    options = parser.parse_args(argv)
    launcher = Path(sys.executable).parent / "deepspeed"
    try:
        script = script_of(options.target, Path(options.results))
        ranks = options.ranks or ranks_of(script)
    except StandaloneError as error:
        parser.error(str(error))
    if not launcher.is_file():
        parser.error(f"{launcher}: this environment has no DeepSpeed launcher; run through `nox -s repro`")
    return run_standalone(script.resolve(), ranks, launcher)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
