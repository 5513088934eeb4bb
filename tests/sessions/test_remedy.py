"""sessions/remedy.py: a remedy is verified only when every cause cell passes with it and no other cell changes
verdict; a patch is applied to its release's sdist as a committed checkout the deepspeed axis pins, and one that does
not apply is reported with git's words, never run."""

import re
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


def patch_remedy(root: Path, diff: str, name: str = "planted") -> Remedy:
    (root / "matrix" / "remedy_patches").mkdir(parents=True, exist_ok=True)
    (root / f"matrix/remedy_patches/{name}.diff").write_text(diff)
    return Remedy(
        name=name,
        kind="patch",
        cause_models=("ctrl.faithful",),
        summary="s",
        mechanism="m",
        patch=f"matrix/remedy_patches/{name}.diff",
        deepspeed="0.19.8",
    )


def test_a_patch_becomes_a_committed_checkout_the_deepspeed_axis_pins(tmp_path):
    remedy = patch_remedy(tmp_path, GOOD_DIFF)
    checkout = patched_checkout((remedy,), tmp_path, tmp_path / "cache", planted_sdist)
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
    again = patched_checkout((remedy,), tmp_path, tmp_path / "cache", lambda release, folder: pytest.fail("downloaded"))
    assert "'ffn'" in (again / RELEASE_FILE).read_text()


def test_a_checkout_is_unpacked_apart_from_another_sessions_unpacking(tmp_path):
    """Two sessions building different checkouts at once (a stack and its required patch, or two helpers' remedies
    in one cache): neither unpacks into, nor removes, the other's tree."""
    others = tmp_path / "cache" / "checkouts" / "unpacking" / "deepspeed-0.19.8"
    others.mkdir(parents=True)
    (others / "half-written.py").write_text("")
    checkout = patched_checkout((patch_remedy(tmp_path, GOOD_DIFF),), tmp_path, tmp_path / "cache", planted_sdist)
    assert (others / "half-written.py").exists() and not (checkout / "half-written.py").exists()


def test_a_patch_that_does_not_apply_is_reported_not_run(tmp_path):
    remedy = patch_remedy(tmp_path, GOOD_DIFF.replace("endswith('o_proj')\n+", "endswith('q_proj')\n+"))
    with pytest.raises(
        PatchError, match=r"planted.diff does not apply to deepspeed 0.19.8 \(git apply --check\): .*auto_tp.py"
    ):
        patched_checkout((remedy,), tmp_path, tmp_path / "cache", planted_sdist)
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
    assert ran == []  # nothing ran: no unpatched DeepSpeed is taken for a patched one


@pytest.mark.autotp
def test_a_remedy_that_does_not_fix_its_cells_is_unverified_in_real_ranks(rank_pool):
    """ctrl's cells at tp 2: the right policy (o_proj's twin `multi_head_attention.dense` row-parallel) passes; a
    policy that leaves it column-parallel fails like no policy, and is reported unverified."""
    from suites.run.driver import RunOptions, run_cell

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
    """The results file `nox -s remedy` writes, read back typed through merge's door: a verified workaround is claimed
    with the exact `init_inference` call that passes it; an unverified one never; a file that does not fit is
    refused naming it."""
    from matrix.remedies import TakenAt
    from reports.outputs.remedy_claims import remedy_sections
    from reports.store import admit_remedies
    from reports.store.door import Rejected
    from sessions.remedy import write_results

    taken = TakenAt("0.19.8", "", "5.25.0", "45708c6", "2026-12-07T09:30:48Z")
    fixed = {**WITHOUT, "ctrl.faithful-eager-fp32-tp2": "pass", "ctrl.faithful-eager-fp32-tp3": "pass"}
    verified = judge(replace(CTRL, name="ctrl-row-parallel-policy"), WITHOUT, fixed, 1.0, "how", taken_at=taken)
    unverified = judge(replace(CTRL, name="bloom-attention-mask"), WITHOUT, WITHOUT, 1.0, "how", taken_at=taken)
    write_results(tmp_path / "remedies.json", [verified, unverified])
    assert admit_remedies(tmp_path / "remedies.json", str) == [verified, unverified]
    text = remedy_sections((verified, unverified), 3, "bf16")
    assert "**Workaround (verified: 2 of 2 cells pass)**" in text and text.count("**Workaround") == 1
    assert (
        'engine = deepspeed.init_inference(\n    model,\n    tensor_parallel={"tp_size": 3},\n'
        "    dtype=torch.bfloat16,\n    replace_with_kernel_inject=False,\n"
        "    injection_policy={blocks['EncoderLayer']: ('multi_head_attention.dense', 'ffn.2')},\n)"
    ) in text
    assert remedy_sections((unverified,), 2, "fp32") == ""
    # a fix tested on top of another names that one by what it changes, never by the harness's name for it
    stacked = replace(verified, kind="patch", requires=("fused-experts-split",))
    text = remedy_sections((stacked,), 2, "fp32")
    assert "on top of 1 other proposed fix" in text and "fused-experts-split" not in text
    assert "- AutoTP splits a MoE block's fused experts" in text
    (tmp_path / "remedies.json").write_text('[{"remedy": 3}]')
    with pytest.raises(Rejected, match="remedies.json: entry 1: "):
        admit_remedies(tmp_path / "remedies.json", str)


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
    monkeypatch.setattr("sessions.remedy.patched_checkout", lambda patches, *args: tmp_path / patches[-1].name)
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
    # `--cause a,b`: the remedies named, each once, in the file's order
    ran.clear()
    picked = run_all(["--results", str(tmp_path), "--cause", "moe-fix,ctrl.faithful,ctrl"], runs, tmp_path, print)
    assert [r.remedy for r in picked] == ["ctrl-fix", "moe-fix"]
    # a patch that turns another cell red is caught by the shared baseline as it was by its own
    ran.clear()
    broken = {**fixed, "moe-fix": {**fixed["moe-fix"], "llama.faithful-eager-fp32-tp2": ("fail", "numerics")}}
    results = run_all(["--results", str(tmp_path)], stand_in_runs(ran, cells, broken), tmp_path, lambda line: None)
    assert results[1].changed == ("llama.faithful-eager-fp32-tp2: pass -> fail numerics",)
    assert [(models, folder) for folder, models, pinned in ran if not pinned] == [
        ("ctrl.faithful", "without"),
        ("registry", "without"),
    ]


ON_TOP = f"""--- a/{RELEASE_FILE}
+++ b/{RELEASE_FILE}
@@ -1,2 +1,2 @@
 def is_row_parallel(name):
-    return name.endswith(('o_proj', 'dense'))
+    return name.endswith(('o_proj', 'dense', 'router'))
"""


def test_a_stack_is_applied_in_order_on_one_checkout_and_verified_against_the_required_patches_alone(tmp_path):
    """`requires`: the required patch first, then the remedy's, each a commit of one checkout; the run without the
    remedy has the required patch, the run with it both, and the result says the claim holds given the required one.
    A patch that does not apply on top of another is refused naming both."""
    base, stacked = patch_remedy(tmp_path, GOOD_DIFF, "base"), patch_remedy(tmp_path, ON_TOP, "on-top")
    stacked = replace(stacked, requires=("base",))
    checkout = patched_checkout((base, stacked), tmp_path, tmp_path / "cache", planted_sdist)
    assert "'dense', 'router'" in (checkout / RELEASE_FILE).read_text()
    log = subprocess.run(["git", "-C", str(checkout), "log", "--format=%s"], capture_output=True, text=True).stdout
    assert log.split("\n")[:3] == ["on-top", "base", "deepspeed 0.19.8"]
    rival = patch_remedy(tmp_path, GOOD_DIFF.replace("'dense'", "'ffn'"), "rival")  # applies alone, not after base
    with pytest.raises(PatchError, match=r"rival.diff does not apply to deepspeed 0.19.8 with base applied"):
        patched_checkout((base, rival), tmp_path, tmp_path / "cache", planted_sdist)
    with pytest.raises(PatchError, match=r"on-top.diff does not apply to deepspeed 0.19.8 \(git apply --check\)"):
        patched_checkout((stacked,), tmp_path, tmp_path / "cache", planted_sdist)

    import json

    from sessions.remedy import Baseline, Runs

    ran = []

    def run(folder, models, remedy_name, pins, name):
        ran.append((folder.name, Path(pins["deepspeed"].removeprefix("deepspeed@")).name, name))
        folder.mkdir(parents=True, exist_ok=True)
        outcome = ("pass", "") if folder.name == "with" else ("fail", "forward")
        cells = {"ctrl.faithful-eager-fp32-tp2": outcome, "ctrl2-eager-fp32-tp2": ("pass", "")}
        with (folder / "cells.jsonl").open("a") as stream:
            for cell, (verdict, failure_class) in cells.items():
                record = {"cell": {"id": cell}, "outcome": verdict, "failure_class": failure_class}
                stream.write(json.dumps(record) + "\n")

    sdists, runs = tmp_path / "cache", Runs(run)
    shared = Baseline(runs, tmp_path / "results" / "remedy" / "without")
    result = verify(
        stacked, runs, shared, tmp_path / "results", tmp_path, lambda line: None, sdists, planted_sdist, (base,)
    )
    assert not shared.ran  # the release without any patch is no baseline of a stacked remedy
    assert ran == [
        ("without", "base-0.19.8", "remedy-base"),
        ("with", "base+on-top-0.19.8", "remedy-base+on-top"),
        ("without", "base-0.19.8", "remedy-base"),
        ("with", "base+on-top-0.19.8", "remedy-base+on-top"),
    ]
    assert (result.status, result.requires, result.fixed) == ("verified", ("base",), ("ctrl.faithful-eager-fp32-tp2",))
    assert result.claim() == "Proposed fix (verified: 1 of 1 cells pass, on top of 1 other proposed fix)"
    assert result.how == ON_TOP  # the proposed fix is the remedy's own diff; the required one is its own remedy


def test_every_shipped_patch_applies_to_its_release_with_git_apply_check(tmp_path):
    """Each patch of matrix/remedies.toml, after the patches it requires, passes `git apply --check` on the files of
    the DeepSpeed release it names, taken from the installed DeepSpeed (the tests' environment has that release,
    whose module files are the sdist's), so no download is needed; a patch against another release is skipped,
    naming it."""
    import importlib.metadata
    import importlib.util
    import shutil

    from matrix.remedies import load_remedies, required_patches

    installed = importlib.metadata.version("deepspeed")
    spec = importlib.util.find_spec("deepspeed")
    assert spec is not None and spec.origin is not None
    package = Path(spec.origin).parent
    remedies = load_remedies()
    patches = [remedy for remedy in remedies if remedy.kind == "patch"]
    assert patches
    checked = []
    for remedy in patches:
        if remedy.deepspeed != installed:
            continue
        tree, stack = tmp_path / remedy.name, (*required_patches(remedy, remedies), remedy)
        diffs = [patch.patch_path(Path(__file__).resolve().parents[2]) for patch in stack]
        for touched in {name for diff in diffs for name in re.findall(r"^\+\+\+ b/(\S+)", diff.read_text(), re.M)}:
            if (package.parent / touched).exists():  # not a file the diff creates
                (tree / touched).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(package.parent / touched, tree / touched)
        subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
        for patch, diff in zip(stack, diffs):
            check = subprocess.run(["git", "apply", "--check", str(diff)], cwd=tree, capture_output=True, text=True)
            assert check.returncode == 0, f"{patch.patch} on deepspeed {installed}: {check.stderr}"
            subprocess.run(["git", "apply", str(diff)], cwd=tree, check=True)
        checked.append(remedy.name)
    if not checked:
        pytest.skip(f"no shipped patch is against the installed deepspeed {installed}")
    assert "fused-experts-split" in checked


def test_a_cell_skipped_in_one_run_only_runs_again_before_the_remedy_is_judged(tmp_path, monkeypatch):
    """A cell the memory plan skipped in the whole-scope run with the remedy (the machine short of RAM then) is run
    again without and with it; its verdict from the second runs is the one judged, so the remedy is verified. A cell
    that still skips on one side stays a change."""
    from sessions.remedy import Baseline, one_sided_skips

    monkeypatch.setattr("sessions.remedy.scope_models", lambda remedy: "ctrl,ctrl2")
    base = {"ctrl.faithful-eager-fp32-tp2": ("fail", "numerics"), "ctrl2-eager-fp32-tp3": ("pass", "")}
    ran: list[tuple[str, str, str]] = []
    skipped_once = {"ctrl.faithful-eager-fp32-tp2": ("pass", ""), "ctrl2-eager-fp32-tp3": ("skip", "")}
    runs = stand_in_runs(ran, base, skipped_once)
    first_run = runs.run

    def run(folder, models, remedy_name, pins, name):  # the second run with the remedy has enough memory
        if remedy_name and models == "ctrl2":
            skipped_once["ctrl2-eager-fp32-tp3"] = ("pass", "")
        first_run(folder, models, remedy_name, pins, name)

    runs = type(runs)(run)
    result = verify(CTRL, runs, Baseline(runs, tmp_path / "without"), tmp_path, tmp_path, lambda line: None)
    assert ran[-2:] == [("without", "ctrl2", ""), ("with", "ctrl2", "ctrl-policy")]
    assert (result.status, result.changed) == ("verified", ())
    assert one_sided_skips({"a.b-eager-fp32-tp2": "pass"}, {"a.b-eager-fp32-tp2": "skip"}) == "a.b"
    assert one_sided_skips({"a.b-eager-fp32-tp2": "skip"}, {"a.b-eager-fp32-tp2": "skip"}) == ""
    assert one_sided_skips({"a.b-eager-fp32-tp2": "pass"}, {}) == "a.b"
