"""sessions/remedy.py: a remedy is verified only when every cause cell passes with it and no other cell changes
verdict; a patch is applied to its release's sdist as a committed checkout the deepspeed axis pins, and one that does
not apply is reported with git's words, never run."""

import subprocess
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from matrix.cell_arguments import CellArguments
from matrix.cells import expand
from matrix.remedies import Remedy
from matrix.version_axes import load_config, parse_axis_value
from sessions.remedy import PatchError, cause_cells, judge, patched_checkout, verify

CTRL = Remedy(
    name="ctrl-policy",
    kind="workaround",
    cause_models=("ctrl.faithful",),
    summary="s",
    mechanism="m",
    injection_policy={"EncoderLayer": ("multi_head_attention.dense", "ffn.2")},
)
WITHOUT = {
    "ctrl.faithful-eager-fp32-tp2": "fail numerics",
    "ctrl.faithful-eager-fp32-tp3": "fail numerics",
    "ctrl-eager-fp32-tp2": "pass",
}


def test_verified_needs_every_cause_cell_green_and_no_other_verdict_changed():
    fixed = {**WITHOUT, "ctrl.faithful-eager-fp32-tp2": "pass", "ctrl.faithful-eager-fp32-tp3": "pass"}
    result = judge(CTRL, WITHOUT, fixed, 12.0, "how")
    assert (result.status, len(result.fixed), result.others_compared, result.changed) == ("verified", 2, 1, ())
    assert result.claim() == "Workaround (verified: 2 of 2 cells pass)"
    half = judge(CTRL, WITHOUT, {**fixed, "ctrl.faithful-eager-fp32-tp3": "fail numerics"}, 1.0, "how")
    assert (half.status, half.fixed, half.claim()) == ("unverified", ("ctrl.faithful-eager-fp32-tp2",), "")
    broke = judge(CTRL, WITHOUT, {**fixed, "ctrl-eager-fp32-tp2": "fail forward"}, 1.0, "how")
    assert broke.status == "unverified"
    assert broke.changed == ("ctrl-eager-fp32-tp2: pass -> fail forward",)
    unrun = judge(CTRL, WITHOUT, {k: v for k, v in fixed.items() if not k.startswith("ctrl-")}, 1.0, "how")
    assert unrun.status == "unverified" and unrun.changed == ("ctrl-eager-fp32-tp2: pass -> not run",)
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    leaked = judge(CTRL, WITHOUT, {}, 1.0, "", problem=f"pip download failed: https://x:{token}@pypi.example/simple")
    assert leaked.status == "not applied" and token not in leaked.problem
    # A cause model's cell that did not fail (skipped, or a dtype DeepSpeed refuses here) is no cause cell to fix
    refused = {**WITHOUT, "ctrl.faithful-eager-fp16-tp2": "unsupported", "ctrl.faithful-eager-bf16-tp2": "skip"}
    assert cause_cells(CTRL, refused) == ("ctrl.faithful-eager-fp32-tp2", "ctrl.faithful-eager-fp32-tp3")


RELEASE_FILE = "deepspeed/module_inject/auto_tp.py"
ORIGINAL = "def is_row_parallel(name):\n    return name.endswith('o_proj')\n"
GOOD_DIFF = f"""--- a/{RELEASE_FILE}
+++ b/{RELEASE_FILE}
@@ -1,2 +1,2 @@
 def is_row_parallel(name):
-    return name.endswith('o_proj')
+    return name.endswith(('o_proj', 'dense'))
"""


def planted_sdist(release: str, folder: Path) -> None:
    """What `pip download` leaves: the release's sdist, here a one-file stand-in."""
    source = folder / "src" / f"deepspeed-{release}"
    (source / "deepspeed" / "module_inject").mkdir(parents=True)
    (source / RELEASE_FILE).write_text(ORIGINAL)
    with tarfile.open(folder / f"deepspeed-{release}.tar.gz", "w:gz") as archive:
        archive.add(source, arcname=source.name)


def patch_remedy(root: Path, diff: str) -> Remedy:
    (root / "matrix" / "remedy_patches").mkdir(parents=True, exist_ok=True)
    (root / "matrix/remedy_patches/planted.diff").write_text(diff)
    return Remedy(
        name="planted",
        kind="patch",
        cause_models=("ctrl.faithful",),
        summary="s",
        mechanism="m",
        patch="matrix/remedy_patches/planted.diff",
        deepspeed="0.19.8",
    )


def test_a_patch_becomes_a_committed_checkout_the_deepspeed_axis_pins(tmp_path):
    remedy = patch_remedy(tmp_path, GOOD_DIFF)
    checkout = patched_checkout(remedy, tmp_path, tmp_path / "cache", planted_sdist)
    assert "'dense'" in (checkout / RELEASE_FILE).read_text()
    log = subprocess.run(["git", "-C", str(checkout), "log", "--format=%s"], capture_output=True, text=True).stdout
    assert log.split("\n")[:2] == ["planted", "deepspeed 0.19.8"]
    assert (
        subprocess.run(["git", "-C", str(checkout), "status", "--porcelain"], capture_output=True, text=True).stdout
        == ""
    )
    pin = parse_axis_value(f"deepspeed@{checkout}", load_config().axes["deepspeed"])
    assert pin.requirement == str(checkout) and pin.id.startswith("ds@local-")
    # The sdist is downloaded once: a second checkout (a changed diff) needs no download.
    (tmp_path / "matrix/remedy_patches/planted.diff").write_text(GOOD_DIFF.replace("'dense'", "'ffn'"))
    again = patched_checkout(remedy, tmp_path, tmp_path / "cache", lambda release, folder: pytest.fail("downloaded"))
    assert "'ffn'" in (again / RELEASE_FILE).read_text()


def test_a_patch_that_does_not_apply_is_reported_not_run(tmp_path):
    remedy = patch_remedy(tmp_path, GOOD_DIFF.replace("endswith('o_proj')\n+", "endswith('q_proj')\n+"))
    with pytest.raises(
        PatchError, match=r"planted.diff does not apply to deepspeed 0.19.8 \(git apply --check\): .*auto_tp.py"
    ):
        patched_checkout(remedy, tmp_path, tmp_path / "cache", planted_sdist)
    ran = []

    def run(folder, models, remedy_name, pins, name):
        ran.append((models, remedy_name, pins))

    from sessions.remedy import Baseline, Runs

    runs = Runs(run)
    result = verify(
        remedy,
        runs,
        Baseline(runs, tmp_path / "results" / "remedy" / "without"),
        tmp_path / "results",
        tmp_path,
        lambda line: None,
        tmp_path / "cache",
        planted_sdist,
    )
    assert result.status == "not applied" and "git apply --check" in result.problem
    assert ran == [
        ("ctrl.faithful", "", {})
    ]  # only the run without it: nothing ran on an unpatched DeepSpeed as if patched


@pytest.mark.autotp
def test_a_remedy_that_does_not_fix_its_cells_is_unverified_in_real_ranks(rank_pool):
    """ctrl's cells at tp 2: the right policy (o_proj's twin `multi_head_attention.dense` row-parallel) passes; a
    policy that leaves it column-parallel fails like no policy, and is reported unverified."""
    from suites.driver import RunOptions, run_cell

    cell = expand("ctrl.faithful", tp="2")[0]
    options = RunOptions(cell_timeout=180.0)

    def verdict(arguments):
        outcome = run_cell(replace(cell, arguments=arguments), rank_pool, options)
        return " ".join(filter(None, (outcome.outcome, outcome.failure_class)))

    without = {cell.id: verdict(CellArguments())}
    assert without[cell.id].startswith("fail")
    wrong = replace(CTRL, injection_policy={"EncoderLayer": ("ffn.2",)})
    result = judge(wrong, without, {cell.id: verdict(wrong.arguments)}, 1.0, "how")
    assert (result.status, result.fixed) == ("unverified", ())
    right = judge(CTRL, without, {cell.id: verdict(CTRL.arguments)}, 1.0, "how")
    assert (right.status, right.fixed) == ("verified", (cell.id,))


def test_only_a_verified_remedy_is_claimed_in_a_draft(tmp_path):
    """The results file `nox -s remedy` writes, read back typed: a verified workaround is claimed with the exact
    `init_inference` call that passes it; an unverified one never; a file that does not fit is refused naming it."""
    from matrix.remedies import read_results
    from reports.outputs.remedy_claims import remedy_sections
    from sessions.remedy import write_results

    fixed = {**WITHOUT, "ctrl.faithful-eager-fp32-tp2": "pass", "ctrl.faithful-eager-fp32-tp3": "pass"}
    verified = judge(CTRL, WITHOUT, fixed, 1.0, "how")
    unverified = judge(replace(CTRL, name="half"), WITHOUT, WITHOUT, 1.0, "how")
    write_results(tmp_path / "remedies.json", [verified, unverified])
    assert read_results(tmp_path / "remedies.json") == [verified, unverified]
    text = remedy_sections((verified, unverified), 3, "bf16")
    assert "**Workaround (verified: 2 of 2 cells pass)**" in text and text.count("**Workaround") == 1
    assert (
        'engine = deepspeed.init_inference(\n    model,\n    tensor_parallel={"tp_size": 3},\n'
        "    dtype=torch.bfloat16,\n    replace_with_kernel_inject=False,\n"
        "    injection_policy={blocks['EncoderLayer']: ('multi_head_attention.dense', 'ffn.2')},\n)"
    ) in text
    assert remedy_sections((unverified,), 2, "fp32") == ""
    (tmp_path / "remedies.json").write_text('[{"remedy": 3}]')
    with pytest.raises(ValueError, match="remedies.json: not a remedies results file"):
        read_results(tmp_path / "remedies.json")


Verdicts = dict[str, tuple[str, str]]


def stand_in_runs(ran: list[tuple[str, str, str]], base: Verdicts, remedied: Verdicts | dict[str, Verdicts]):
    """Runs that write the verdicts they are given (with a remedy or a pinned patch `remedied`, or `remedied[name]`
    by the remedy's or the pinned checkout's name; else `base`) for the cells `--models` selects into the folder's
    cells.jsonl, logging (folder, models, remedy or pinned deepspeed)."""
    import json

    from sessions.remedy import Runs, selects

    def run(folder, models, remedy_name, pins, name):
        which = remedy_name or pins.get("deepspeed", "").rpartition("/")[2]
        ran.append((folder.name, models, which))
        verdicts = base if not which else remedied[which] if which in remedied else remedied
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "cells.jsonl").open("a") as stream:
            for cell, (outcome, failure_class) in verdicts.items():
                if selects(models, cell):
                    record = {"cell": {"id": cell}, "outcome": outcome, "failure_class": failure_class}
                    stream.write(json.dumps(record | {"run": {"id": name}}) + "\n")

    return Runs(run)


def test_verify_runs_the_scope_only_once_the_cause_passes_and_catches_a_changed_verdict(tmp_path, monkeypatch):
    """The session's order with stand-in runs: a remedy that fixes its cause but turns another cell of its scope red
    is unverified, naming the cell."""
    from sessions.remedy import Baseline

    monkeypatch.setattr("sessions.remedy.scope_models", lambda remedy: "ctrl,ctrl2")
    base = {"ctrl.faithful-eager-fp32-tp2": ("fail", "numerics"), "ctrl2-eager-fp32-tp2": ("pass", "")}
    remedied = {"ctrl.faithful-eager-fp32-tp2": ("pass", ""), "ctrl2-eager-fp32-tp2": ("fail", "forward")}
    ran: list[tuple[str, str, str]] = []
    runs = stand_in_runs(ran, base, remedied)
    result = verify(CTRL, runs, Baseline(runs, tmp_path / "without"), tmp_path, tmp_path, lambda line: None)
    assert ran == [
        ("without", "ctrl.faithful", ""),
        ("with", "ctrl.faithful", "ctrl-policy"),
        ("without", "ctrl,ctrl2", ""),
        ("with", "ctrl,ctrl2", "ctrl-policy"),
    ]
    assert (result.status, result.fixed) == ("unverified", ("ctrl.faithful-eager-fp32-tp2",))
    assert result.changed == ("ctrl2-eager-fp32-tp2: pass -> fail forward",)


def test_several_patches_share_one_run_of_the_default_matrix_without_them(tmp_path, monkeypatch):
    """Three patches of one `nox -s remedy` (two verified, one that fixes nothing): the default matrix runs without
    any patch once, before the first patch's whole-matrix run; every later patch reads its cause cells and its scope
    from that run, and each is judged on it (the patch that broke another cell is caught)."""
    from sessions.remedy import run_all

    cells = {
        "ctrl.faithful-eager-fp32-tp2": ("fail", "forward"),
        "phimoe.faithful-eager-fp32-tp2": ("fail", "numerics"),
        "bloom.faithful-eager-fp32-tp2": ("fail", "forward"),
        "llama.faithful-eager-fp32-tp2": ("pass", ""),
    }
    fixed = {
        "ctrl-fix": {**cells, "ctrl.faithful-eager-fp32-tp2": ("pass", "")},
        "moe-fix": {**cells, "phimoe.faithful-eager-fp32-tp2": ("pass", "")},
        "no-fix": cells,
    }
    patches = [
        Remedy(name=name, kind="patch", cause_models=(model,), summary="s", mechanism="m", patch="p", deepspeed="0")
        for name, model in (("ctrl-fix", "ctrl.faithful"), ("moe-fix", "phimoe.faithful"), ("no-fix", "gpt2.faithful"))
    ]
    monkeypatch.setattr("sessions.remedy.load_remedies", lambda path, root: patches)
    monkeypatch.setattr("sessions.remedy.how_text", lambda remedy, root: "diff")
    monkeypatch.setattr("sessions.remedy.patched_checkout", lambda remedy, *args: tmp_path / remedy.name)
    ran: list[tuple[str, str, str]] = []
    runs = stand_in_runs(ran, cells, fixed)
    results = run_all(["--results", str(tmp_path)], runs, tmp_path, lambda line: None)
    without = [(models, folder) for folder, models, pinned in ran if not pinned]
    assert without == [("ctrl.faithful", "without"), ("registry", "without")]
    assert [r.status for r in results] == ["verified", "verified", "unverified"]
    assert results[2].problem.startswith("no cell of gpt2.faithful fails without it")
    assert [(r.cause_cells, r.others_compared) for r in results[:2]] == [
        (("ctrl.faithful-eager-fp32-tp2",), 3),
        (("phimoe.faithful-eager-fp32-tp2",), 3),
    ]
    # a patch that turns another cell red is caught by the shared baseline as it was by its own
    ran.clear()
    broken = {**fixed, "moe-fix": {**fixed["moe-fix"], "llama.faithful-eager-fp32-tp2": ("fail", "numerics")}}
    results = run_all(["--results", str(tmp_path)], stand_in_runs(ran, cells, broken), tmp_path, lambda line: None)
    assert results[1].changed == ("llama.faithful-eager-fp32-tp2: pass -> fail numerics",)
    assert [(models, folder) for folder, models, pinned in ran if not pinned] == [
        ("ctrl.faithful", "without"),
        ("registry", "without"),
    ]
