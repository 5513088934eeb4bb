"""Does each cause's draft issue reproduce it without this harness (#55's first "Done when")? For every cause of
report.json's "failing now": save the minimal script its draft issue inlines (a cause with no draft, e.g. one
unsupported upstream: its full repro script), run it alone as the draft says, `deepspeed --num_gpus <tp> <script>` in an
empty folder, with the cells' environment's python and nothing of the harness on the path, and compare what it shows
with the cause: a minimal script raises the cause's exception (numbers masked) or fails its one assertion
(AssertionError) and never prints "not reproduced"; a full script prints `RESULT: RAISED <stage> <type>` with the
cause's message, or `RESULT: MISMATCH` with the failing check its class names. One script at a time (they are rank
groups: run it under the heavy-work lock).

    <results' environment>/bin/python benchmarks/draft_scripts.py results /tmp/draft-scripts [CAUSE_ID ...]

Prints one line per cause and "N of M causes' scripts reproduce their cause"; each script, its output and
summary.json stay under the output folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DRAFT_COMMAND = re.compile(r"Save as `([^`]+)` and run `deepspeed --num_gpus (\d+) [^`]+`")
DRAFT_SCRIPT = re.compile(r"```python\n(.*?)\n```", re.S)
RESULT_LINE = re.compile(r"RESULT: (?:MATCH|MISMATCH|RAISED \w+ [\w.]+)")
RAISED_MESSAGE = re.compile(r"RESULT: RAISED \w+ (.*)")
FAILING_CHECK = {"numerics": "FAIL logits", "generation": "FAIL generation", "memory": "FAIL memory"}
COMPARED_CHARACTERS = 40  # of the masked message: past it, the harness's masking ("[N…]") and torch's differ
EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]: )?(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.*)$", re.M)
NOT_REPRODUCED = "not reproduced"  # what a minimal script prints when its forward did not fail


@dataclass(frozen=True)
class Verdict:
    cause: str
    failure_class: str
    cell: str
    source: str
    expected: str
    printed: list[str]
    same_message: bool
    seconds: float

    @property
    def reproduces(self) -> bool:
        return self.expected in self.printed and NOT_REPRODUCED not in self.printed and self.same_message


def masked(text: str) -> str:
    """Numbers as N, as the harness masks a signature's."""
    return re.sub(r"\d+", "N", text)


def expected_result(cause: dict[str, Any], minimal: bool) -> str:
    raising = cause["failure_class"] in ("shard", "forward")
    exception = cause["cause"].split(" @ ")[0].split(":")[0].strip()
    if minimal:
        return f"raised {exception}" if raising else "AssertionError"
    return f"RESULT: RAISED {cause['failure_class']} {exception}" if raising else "RESULT: MISMATCH"


def printed_results(output: str, minimal: bool) -> list[str]:
    """What a script showed: a minimal script's exceptions (`raised <type>`, AssertionError alone), a full one's
    RESULT lines."""
    if not minimal:
        return sorted(set(RESULT_LINE.findall(output)))
    shown = {
        m.group(1) if m.group(1) == "AssertionError" else f"raised {m.group(1)}"
        for m in EXCEPTION_LINE.finditer(output)
    }
    return sorted(shown | ({NOT_REPRODUCED} if NOT_REPRODUCED in output else set()))


def same_message(cause: dict[str, Any], output: str, minimal: bool) -> bool:
    """The raised message starts like the cause's (numbers masked), or the check the class names failed."""
    wanted = masked(cause["cause"].split(" @ ")[0]).split("[")[0][:COMPARED_CHARACTERS]
    if cause["failure_class"] not in ("shard", "forward"):
        return "AssertionError" in output if minimal else FAILING_CHECK[cause["failure_class"]] in output
    if minimal:
        said = [masked(f"{m.group(1)}: {m.group(2)}").split("[")[0] for m in EXCEPTION_LINE.finditer(output)]
    else:
        said = [masked(m.group(1)).split("[")[0] for m in RAISED_MESSAGE.finditer(output)]
    return any(text[:COMPARED_CHARACTERS] == wanted for text in said)


def save_script(cause: dict[str, Any], results: Path, folder: Path) -> tuple[str, str, str]:
    """(script name, tp, where it came from: "draft issue" for its minimal script), the script written into folder."""
    tp = cause["repro"]["cell"].rsplit("-tp", 1)[1]
    if not cause["draft"]:
        script = results / cause["repro"]["script"]
        shutil.copy(script, folder / script.name)
        return script.name, tp, f"repro script (no draft: {cause.get('status', '')})"
    text = (results / cause["draft"]).read_text()
    command, code = DRAFT_COMMAND.search(text), DRAFT_SCRIPT.search(text)
    if not (command and code):
        raise SystemExit(f"{cause['draft']}: no script or no command to run it")
    (folder / command.group(1)).write_text(code.group(1) + "\n")
    return command.group(1), command.group(2), "draft issue"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def run_alone(name: str, tp: str, folder: Path) -> str:
    """The launcher as `deepspeed` runs it (this python's), on CPU, without PYTHONPATH: nothing of the harness."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(DS_ACCELERATOR="cpu", PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", tp, "--master_port", str(free_port())]
    try:
        done = subprocess.run([*command, name], cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        return done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:
        return f"{error.stdout!s}{error.stderr!s}\nTIMEOUT after 600 s"


def check(cause: dict[str, Any], results: Path, out: Path) -> Verdict:
    folder = out / f"{cause['failure_class']}-{cause['id']}"
    folder.mkdir(parents=True, exist_ok=True)
    name, tp, source = save_script(cause, results, folder)
    minimal = source == "draft issue"
    started = time.monotonic()
    output = run_alone(name, tp, folder)
    (folder / "output.log").write_text(output)
    return Verdict(
        cause=cause["id"],
        failure_class=cause["failure_class"],
        cell=cause["repro"]["cell"],
        source=source,
        expected=expected_result(cause, minimal),
        printed=printed_results(output, minimal),
        same_message=same_message(cause, output, minimal),
        seconds=round(time.monotonic() - started, 1),
    )


def example_classes(results: Path) -> dict[str, str]:
    """Each failing cell's own failure class (results/cells.jsonl, its newest record): a cause of several classes
    ("numerics, forward") is reproduced on its example cell, whose class says what its script prints."""
    classes = {}
    for line in (results / "cells.jsonl").read_text().splitlines():
        record = json.loads(line)
        classes[record["cell"]["id"]] = record["failure_class"]
    return classes


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0].startswith("-"):
        raise SystemExit(__doc__)
    results, out, only = Path(argv[0]), Path(argv[1]), set(argv[2:])
    classes = example_classes(results)
    causes = [
        {**cause, "failure_class": classes.get(cause["repro"]["cell"]) or cause["failure_class"].split(", ")[0]}
        for cause in json.loads((results / "report.json").read_text())["failing_now"]["causes"]
    ]
    verdicts = []
    for cause in causes:
        if only and cause["id"] not in only:
            continue
        verdict = check(cause, results, out)
        verdicts.append(verdict)
        word = "reproduces" if verdict.reproduces else "DOES NOT reproduce"
        print(
            f"{word}: {verdict.failure_class} {verdict.cell} ({verdict.source}, {verdict.seconds} s): "
            f"expected {verdict.expected}, printed {verdict.printed or 'no RESULT line'}",
            flush=True,
        )
    (out / "summary.json").write_text(json.dumps([asdict(v) for v in verdicts], indent=1))
    print(f"{sum(v.reproduces for v in verdicts)} of {len(verdicts)} causes' scripts reproduce their cause")
    return 0 if all(v.reproduces for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
