"""reports.search.bisect: the search, cell ids, verdicts, release ranges, commit bisection of a real git
repository (with real per-commit environments) and the answer in the history store and the report."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from reports import ReportsError
from reports.__main__ import main as reports_main
from reports.analysis.history import analyse
from reports.clones.git import GitRepo
from reports.outputs.model import read_report
from reports.search.bisect import bisect_commits, held_fixed_pins, stored_release_answer
from reports.search.cell_runs import CellProbe, CellRun, classify, parse_cell, release_candidates
from reports.search.steps import BAD, GOOD, SKIP, BisectError, Verdict, search
from reports.store.history_store import HistoryStore
from reports.store.records import Bisection, CellKey, CellResult, Run, Versions
from sessions.environments import READY_MARKER, EnvironmentSpec
from tests.fake_packages import make_repo, pyproject

FIXTURES = Path(__file__).parents[1] / "matrix" / "fixtures"


# ---- the search --------------------------------------------------------------------------------------------------


def counting_probe(first_bad: int, skipped=(), calls=None):
    def probe(candidate: str) -> Verdict:
        calls.append(candidate) if calls is not None else None
        index = int(candidate)
        return Verdict(SKIP if index in skipped else BAD if index >= first_bad else GOOD)

    return probe


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 100])
def test_finds_every_boundary_within_log2_plus_two_runs(n):
    candidates = [str(i) for i in range(n)]
    for first_bad in range(1, n):
        calls = []
        answer = search(candidates, counting_probe(first_bad, calls=calls))
        assert (answer.before, answer.after, answer.untestable) == (str(first_bad - 1), str(first_bad), ())
        assert len(calls) == len(set(calls)) <= math.ceil(math.log2(n)) + 2
        assert calls[0] == str(n - 1)  # the failing end first: its failure is the reference


def test_skipped_steps_are_replaced_by_their_neighbours():
    candidates = [str(i) for i in range(10)]
    calls = []
    answer = search(candidates, counting_probe(6, skipped={4, 5}, calls=calls))
    assert (answer.before, answer.after, answer.untestable) == ("3", "6", ("4", "5"))  # git bisect: "one of 4 5 6"
    assert "4" in calls and "5" in calls
    answer = search(candidates, counting_probe(6, skipped={5}))
    assert (answer.before, answer.after, answer.untestable) == ("4", "6", ("5",))
    answer = search(candidates, counting_probe(3, skipped={5, 6}))  # skips outside the answer cost but do not blur it
    assert (answer.before, answer.after, answer.untestable) == ("2", "3", ())


def test_fixed_mode_searches_from_bad_to_good():
    candidates = [str(i) for i in range(12)]
    calls = []
    probe = lambda c: (calls.append(c), Verdict(GOOD if int(c) >= 7 else BAD))[1]  # noqa: E731
    answer = search(candidates, probe, start=BAD)
    assert (answer.before, answer.after) == ("6", "7")
    assert calls[0] == "0"  # the failing end first


def test_ends_that_do_not_differ_are_refused():
    candidates = [str(i) for i in range(5)]
    with pytest.raises(BisectError, match="4 should be bad but is good"):
        search(candidates, lambda c: Verdict(GOOD))
    with pytest.raises(BisectError, match=r"0 should be good but is bad \(shard: X\)"):
        search(candidates, lambda c: Verdict(BAD, "shard: X"))
    with pytest.raises(BisectError, match="4 should be bad but is skip"):
        search(candidates, lambda c: Verdict(SKIP))
    with pytest.raises(BisectError, match="at least two candidates"):
        search(["1"], lambda c: Verdict(BAD))


# ---- cells and verdicts ------------------------------------------------------------------------------------------


def test_cell_ids_parse_against_the_registries():
    assert parse_cell("llama-eager-fp32-tp3") == CellKey("llama", "eager", "fp32", 3)
    assert parse_cell("qwen2_moe-eager-bf16-tp2") == CellKey("qwen2_moe", "eager", "bf16", 2)
    assert parse_cell("llama-meta_host-bf16-tp2") == CellKey("llama", "meta_host", "bf16", 2)
    assert parse_cell(CellKey("qwen2_moe", "meta_bin", "fp16", 4).id).variant == "meta_bin"  # id and parse agree
    with pytest.raises(BisectError, match="makes 'nosuchmodel-eager'; models: .*llama"):
        parse_cell("nosuchmodel-eager-fp32-tp2")
    with pytest.raises(BisectError, match="is not a cell id"):
        parse_cell("llama-eager-fp8-tp2")
    with pytest.raises(BisectError, match="is not a cell id"):
        parse_cell("llama")


def test_only_the_reference_failure_is_bad():
    reference = ("shard", "AssertionError: heads @ deepspeed/module_inject/auto_tp.py:f")
    same = CellRun("fail", *reference, "boom")
    other = CellRun("fail", "setup", "ImportError: cannot import name X", "boom")
    assert classify(CellRun("pass", "", "", ""), reference, False).kind == GOOD
    assert classify(same, reference, False).kind == BAD
    assert classify(other, reference, False) == Verdict(
        SKIP,
        "a different failure (setup: ImportError: cannot import name X); --any-failure counts it as bad, "
        "--mode gone as gone",
    )
    assert classify(other, reference, True).kind == BAD
    assert classify(CellRun("fail", "install", "pip failed", ""), None, True).kind == SKIP
    assert classify(CellRun("skip", "", "", "needs 4 ranks"), reference, False).kind == SKIP
    assert classify(other, None, False).kind == BAD  # the first failure seen becomes the reference


def test_release_ranges_come_from_release_data(monkeypatch, tmp_path):
    shutil.copy(FIXTURES / "deepspeed.json", tmp_path / "deepspeed.json")
    monkeypatch.setenv("AUTOTP_MATRIX_CACHE_DIR", str(tmp_path))
    from packaging.version import Version

    releases = json.loads((tmp_path / "deepspeed.json").read_text())["releases"]
    stable = sorted((v for v in releases if not Version(v).is_prerelease and not Version(v).is_devrelease), key=Version)
    low, high = stable[-4], stable[-1]
    candidates = release_candidates("deepspeed", low, high, Version("3.11"))
    assert candidates[0] == low and candidates[-1] == high
    assert all(Version(low) <= Version(c) <= Version(high) and not Version(c).is_prerelease for c in candidates)
    with pytest.raises(BisectError, match="deepspeed 0.99.1 is not a release on PyPI"):
        release_candidates("deepspeed", low, "0.99.1", Version("3.11"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cell", "nosuch-eager-fp32-tp2", "--good", "0.16.4", "--bad", "0.17.0"], "no model with a variant makes"),
        (["--cell", "llama-eager-fp32-tp2", "--good", "0.17.0", "--bad", "0.17.0"], "--good and --bad are both 0.17.0"),
        (
            ["--cell", "llama-eager-fp32-tp2", "--axis", "transformers", "--good", "1", "--bad", "2", "--refine"],
            "use --axis deepspeed",
        ),
        (
            ["--cell", "llama-eager-fp32-tp2", "--good", "0.16.4", "--bad", "0.17.0", "--refine"],
            "needs --deepspeed-repo",
        ),
        (
            ["--cell", "llama-eager-fp32-tp2", "--good", "0.16.4", "--bad", "0.17.0", "--pin", "numpy=2"],
            "'numpy=2' must be AXIS=VALUE",
        ),
    ],
)
def test_command_line_errors_say_what_to_change(argv, message, capsys, tmp_path):
    assert reports_main(["bisect", *argv, "--store", str(tmp_path / "store.sqlite")]) == 2
    assert message in capsys.readouterr().err


def test_range_order_is_checked_per_mode(capsys, monkeypatch, tmp_path):
    shutil.copy(FIXTURES / "deepspeed.json", tmp_path / "deepspeed.json")
    monkeypatch.setenv("AUTOTP_MATRIX_CACHE_DIR", str(tmp_path))
    pins = ["--pin", "transformers=5.24.0", "--pin", "torch=2.13.0", "--store", str(tmp_path / "s.sqlite")]
    assert reports_main(["bisect", "--cell", "llama-eager-fp32-tp2", "--good", "0.17.0", "--bad", "0.16.4", *pins]) == 2
    assert (
        "in --mode broken, --good 0.17.0 must be older than --bad 0.16.4 (to find a fix, use --mode fixed)"
        in capsys.readouterr().err
    )
    fixed = ["--cell", "llama-eager-fp32-tp2", "--good", "0.16.4", "--bad", "0.17.0", "--mode", "fixed"]
    assert reports_main(["bisect", *fixed, *pins]) == 2
    assert "in --mode fixed, --bad 0.17.0 must be older than --good 0.16.4" in capsys.readouterr().err


# ---- commit bisection on a real git repository -------------------------------------------------------------------

# The fake package's history. "shard" is what the fake cell calls; the untestable commit breaks the build.
GOOD_SHARD = "def shard(heads, ranks):\n    return [heads // ranks] * ranks\n"
BAD_SHARD = "def shard(heads, ranks):\n    raise AssertionError(f'heads {heads} not divisible by {ranks}')\n"
HISTORY = [
    ("Initial fake DeepSpeed", {"fakeds/shard.py": GOOD_SHARD}),
    ("Docs (#4001)", {"README.md": "fake\n"}),
    ("Refactor the launcher (#4002)", {"fakeds/launcher.py": "RANKS = 2\n"}),
    ("Half-done packaging change (#4003)", {"pyproject.toml": "this is not toml ["}),  # untestable: install fails
    ("Fix packaging (#4004)", {"pyproject.toml": None}),
    ("Shard heads strictly (#4321)", {"fakeds/shard.py": BAD_SHARD, "fakeds/checks.py": "STRICT = True\n"}),
    ("Unrelated (#4322)", {"README.md": "fake 2\n"}),
    ("Unrelated again (#4323)", {"fakeds/launcher.py": "RANKS = 4\n"}),
    ("Allow uneven heads again (#4400)", {"fakeds/shard.py": GOOD_SHARD}),
    ("Release (#4401)", {"README.md": "fake 3\n"}),
]
FAKE_CELL = textwrap.dedent("""\
    # Stands in for `pytest suites`: runs one "cell" against the installed fakeds, writes cells.jsonl.
    import json, sys
    from pathlib import Path
    cell_ids, results = sys.argv[1].split(","), Path(sys.argv[2])
    records = []
    for cell_id in cell_ids:
        record = {"cell": {"id": cell_id}, "outcome": "pass", "failure_class": "", "signature": "", "message": ""}
        try:
            from fakeds.shard import shard
            shard(6, 4)
        except AssertionError as error:
            record.update(outcome="fail", failure_class="shard",
                          signature="AssertionError: heads N not divisible by N", message=str(error))
        records.append(json.dumps(record) + "\\n")
    results.mkdir(parents=True, exist_ok=True)
    (results / "cells.jsonl").write_text("".join(records))
""")


@pytest.fixture(scope="module")
def fake_deepspeed(tmp_path_factory):
    """A git repository of a fake package with one known bad commit (#4321), one untestable commit
    (#4003) and a fix (#4400); shas in history order."""
    repo = tmp_path_factory.mktemp("fakeds")
    history = [(subject, files, "v0.1.0" if n == 0 else "") for n, (subject, files) in enumerate(HISTORY)]
    history[0][1]["fakeds/__init__.py"] = ""
    history[0][1]["deepspeed/__init__.py"] = ""  # what marks a DeepSpeed clone (reports.clones.git.PROJECT_FILE)
    return repo, make_repo(repo, pyproject("fakeds", include="fakeds*"), history)


@pytest.fixture(scope="module")
def fake_probe(tmp_path_factory, fake_deepspeed):
    """A probe that installs fakeds from each commit into its own venv (reused across tests) and runs the fake cell."""
    repo, _ = fake_deepspeed
    root = tmp_path_factory.mktemp("envs")
    script = root / "fake_cell.py"
    script.write_text(FAKE_CELL)

    def environment(sha: str) -> EnvironmentSpec:
        # Like commit_environment: the build runs without isolation, on the env's setuptools and wheel.
        source = str(root / sha[:12] / "src")
        return EnvironmentSpec(
            key=sha[:12],
            installs=(("setuptools", "wheel"), ("--no-build-isolation", "--no-deps", source)),
            source=(repo, sha),
        )

    def make() -> CellProbe:
        return CellProbe(
            CellKey("llama", "eager", "fp32", 2),
            env_root=root,
            environment=environment,
            command=lambda python, cells, results, _: [
                str(python),
                str(script),
                ",".join(c.id for c in cells),
                str(results),
            ],
        )

    return make, root


def test_first_bad_commit_with_an_untestable_commit_skipped(fake_deepspeed, fake_probe, capsys):
    repo, shas = fake_deepspeed
    make, root = fake_probe
    probe = make()
    answer, commit = bisect_commits(probe.cell, GitRepo(repo), good="v0.1.0", bad=shas[7], mode="broken", probe=probe)

    assert (answer.before, answer.after, answer.untestable) == (shas[4], shas[5], ())
    assert (commit.sha, commit.subject, commit.pr) == (shas[5], "Shard heads strictly (#4321)", 4321)
    assert commit.files == ("fakeds/checks.py", "fakeds/shard.py")
    steps = {step.candidate: step for step in answer.steps}
    assert [s.candidate for s in answer.steps] == [shas[7], shas[0], shas[3], shas[4], shas[5]]  # ceil(log2 8)+2 = 5
    assert steps[shas[3]].verdict == SKIP and "could not install" in steps[shas[3]].detail
    assert (steps[shas[7]].verdict, steps[shas[7]].detail) == (BAD, "shard: AssertionError: heads N not divisible by N")
    assert probe.reference == ("shard", "AssertionError: heads N not divisible by N")
    assert (root / shas[0][:12] / READY_MARKER).exists() and not (root / shas[3][:12] / READY_MARKER).exists()
    printed = capsys.readouterr().out
    assert f"commit {shas[3]} skip" in printed and f"commit {shas[5]} bad" in printed


def test_mode_fixed_finds_the_fix_and_reuses_environments(fake_deepspeed, fake_probe):
    repo, shas = fake_deepspeed
    make, root = fake_probe
    probe = make()
    ready_before = (root / shas[7][:12] / READY_MARKER).stat().st_mtime
    answer, commit = bisect_commits(
        probe.cell, GitRepo(repo), good=shas[9], bad=shas[5], mode="fixed", probe=probe
    )  # --good new, --bad old
    assert (answer.before, answer.after) == (shas[7], shas[8])
    assert (commit.subject, commit.pr, commit.files) == ("Allow uneven heads again (#4400)", 4400, ("fakeds/shard.py",))
    assert (root / shas[7][:12] / READY_MARKER).stat().st_mtime == ready_before  # reused, not rebuilt


def test_commit_ranges_are_checked(fake_deepspeed, tmp_path):
    repo, shas = fake_deepspeed
    clone = GitRepo(repo)
    with pytest.raises(ReportsError, match="is not an ancestor of"):
        clone.line(shas[5], shas[2])
    with pytest.raises(ReportsError, match="same commit"):
        clone.line("v0.1.0", shas[0])
    with pytest.raises(ReportsError, match="no commit or tag 'v9.9'"):
        clone.line("v9.9", shas[2])
    with pytest.raises(ReportsError, match="not a git clone"):
        GitRepo(tmp_path)


# ---- the answer in the store and the report ----------------------------------------------------------------------


def _run(run_id: str, started: str, deepspeed: str) -> Run:
    # torch as an installed CPU build reports itself; a bisection pins "torch 2.13.0": the same release.
    return Run(
        run_id, "nightly", "runner-1", started, "cpu", "gloo", Versions(deepspeed, "5.24.0", "2.13.0+cpu", "3.11.7")
    )


def test_report_says_broken_by_the_pr(tmp_path):
    store = tmp_path / "history.sqlite"
    cell = CellKey("llama", "eager", "fp32", 2)
    with HistoryStore(store, create=True) as history:
        for n, (deepspeed, outcome) in enumerate([("0.16.4", "pass"), ("0.17.0", "fail")]):
            run = _run(f"r{n}", f"2026-01-0{n + 1}T00:00:00Z", deepspeed)
            failure = ("shard", "AssertionError: heads N") if outcome == "fail" else ("", "")
            history.import_runs([(run, [CellResult(run.run_id, cell, outcome, *failure)])], source=tmp_path)
        history.add_bisection(
            Bisection(
                cell,
                "broken",
                "deepspeed",
                "0.16.5",
                "0.16.6",
                (("transformers", "5.24.0"), ("torch", "2.13.0")),
                "shard",
                "AssertionError: heads N",
                commit="ab" * 20,
                subject="Shard heads strictly (#4321)",
                pr=4321,
                files=("a.py",),
                recorded_at="2026-01-03T00:00:00+00:00",
            )
        )
        # Newer, but run with another transformers held fixed: an answer about other versions.
        history.add_bisection(
            Bisection(
                cell,
                "broken",
                "deepspeed",
                "0.16.6",
                "0.16.7",
                (("transformers", "5.23.0"), ("torch", "2.13.0")),
                "shard",
                "AssertionError: heads N",
                commit="cd" * 20,
                subject="Other (#9999)",
                pr=9999,
                recorded_at="2026-01-04T00:00:00+00:00",
            )
        )
        assert history.bisections()[0].files == ("a.py",)
    assert reports_main(["render", "--store", str(store), "--out", str(tmp_path / "out")]) == 0
    markdown = (tmp_path / "out" / "report.md").read_text()
    url = "https://github.com/deepspeedai/DeepSpeed"
    answer = (
        f"broke at deepspeed 0.16.5 → 0.16.6, first bad commit [{'ab' * 5}]({url}/commit/{'ab' * 20}) "
        f'([#4321]({url}/pull/4321) "Shard heads strictly")'
    )
    assert f"   - answer: {answer}" in markdown.splitlines()  # the root cause's answer
    assert f"- llama tp2 eager fp32: {answer}, shard: AssertionError: heads N" in markdown.splitlines()  # details
    assert f'<a href="{url}/pull/4321">#4321</a>' in (tmp_path / "out" / "report.html").read_text()
    report = read_report(tmp_path / "out")
    bisection = report.regressions[0].bisection
    assert bisection is not None and bisection.pr == 4321


def test_other_axes_come_from_the_stored_failing_run_and_refine_reuses_a_stored_answer(tmp_path):
    store = tmp_path / "history.sqlite"
    cell = CellKey("llama", "eager", "fp32", 2)
    with HistoryStore(store, create=True) as history:
        run = Run(
            "r1",
            "nightly",
            "runner-1",
            "2026-01-01T00:00:00Z",
            "cpu",
            "gloo",
            Versions("0.17.0", "4.57.6", "2.13.0", "3.11.7"),
        )
        history.import_runs([(run, [CellResult("r1", cell, "fail", "shard", "X")])], source=tmp_path)
        history.add_bisection(
            Bisection(
                cell,
                "broken",
                "deepspeed",
                "0.16.5",
                "0.16.6",
                (("transformers", "4.57.6"), ("torch", "2.13.0")),
                "shard",
                "X",
                recorded_at="2026-01-02T00:00:00+00:00",
            )
        )
        # Newer, inside the range too, but run at another transformers: an answer about other versions.
        history.add_bisection(
            Bisection(
                cell,
                "broken",
                "deepspeed",
                "0.16.7",
                "0.16.8",
                (("transformers", "5.24.0"), ("torch", "2.13.0")),
                "shard",
                "X",
                recorded_at="2026-01-03T00:00:00+00:00",
            )
        )
    assert held_fixed_pins(cell, "deepspeed", "0.17.0", {}, store) == {
        "deepspeed": "0.17.0",
        "transformers": "4.57.6",
        "torch": "2.13.0",
    }
    assert held_fixed_pins(cell, "deepspeed", "0.17.0", {"torch": "2.12.0"}, store)["torch"] == "2.12.0"
    held = (("transformers", "4.57.6"), ("torch", "2.13.0"))
    assert (
        stored_release_answer(
            store, cell, axis="deepspeed", mode="broken", good="0.16.4", bad="0.17.0", held_fixed=held
        ).after
        == "0.16.6"
    )
    assert (
        stored_release_answer(
            store, cell, axis="deepspeed", mode="broken", good="0.16.6", bad="0.17.0", held_fixed=held
        )
        is None
    )  # outside
    assert (
        stored_release_answer(store, cell, axis="deepspeed", mode="fixed", good="0.17.0", bad="0.16.4", held_fixed=held)
        is None
    )
    # The same rule as the report's (reports.analysis.history.answer_for): the other transformers' answer is the one
    # for those versions only.
    assert (
        stored_release_answer(
            store,
            cell,
            axis="deepspeed",
            mode="broken",
            good="0.16.4",
            bad="0.17.0",
            held_fixed=(("transformers", "5.24.0"), ("torch", "2.13.0")),
        ).after
        == "0.16.8"
    )


# ---- a real DeepSpeed range ----------------------------------------------------------------------------------------

# Opt-in (PyPI access, several minutes per release on a 2-core machine): AUTOTP_BISECT_REAL=<env root to build/reuse>.
REAL_ENV_ROOT = os.environ.get("AUTOTP_BISECT_REAL")
# (--bad, --good, last bad, first good) for llama-eager-fp32-tp2 at transformers 5.24.0, torch 2.13.0 (CPU, gloo).
# Established on 2026-12-02 by running the cell at each release of the range in its own venv (deepspeed==X from
# PyPI): 0.19.4 and 0.19.5 fail with "shard: RuntimeError: split_with_sizes expects split_sizes to sum exactly to
# N ..., but got split_sizes=[N, N] @ deepspeed/module_inject/layers.py:uneven_partition" (96 split as [64, 0]
# on 2 ranks); 0.19.6 passes (as does 0.19.8; 0.16.9, 0.18.5 and 0.19.1 fail the same way). Those runs were the
# steps of `python -m reports bisect --mode fixed --bad 0.16.9 --good 0.19.8` (7 steps for 27 releases) plus this
# test's own run. At commit level (--deepspeed-repo on a DeepSpeed clone, source builds without prebuilt ops),
# 6098f799ee77 fails the same way and its child aa3914df82e8 "[AutoTP] Complete uneven sharding and universal
# checkpoint support (#8185)" passes.
REAL_RANGE = ("0.19.4", "0.19.6", "0.19.5", "0.19.6")


@pytest.mark.skipif(not REAL_ENV_ROOT, reason="set AUTOTP_BISECT_REAL=<folder> to bisect real releases from PyPI")
def test_real_deepspeed_releases(tmp_path):
    bad, good, last_bad, first_good = REAL_RANGE
    store = tmp_path / "history.sqlite"
    assert (
        reports_main(
            [
                "bisect",
                "--cell",
                "llama-eager-fp32-tp2",
                "--mode",
                "fixed",
                "--bad",
                bad,
                "--good",
                good,
                "--pin",
                "transformers=5.24.0",
                "--pin",
                "torch=2.13.0",
                "--store",
                str(store),
                "--env-root",
                REAL_ENV_ROOT,
            ]
        )
        == 0
    )
    with HistoryStore(store, create=False) as history:
        answer = history.bisections()[-1]
    assert (answer.before, answer.after, answer.failure_class) == (last_bad, first_good, "shard")
    assert "split_with_sizes" in answer.signature


# ---- --mode gone: where one failure turns into another ---------------------------------------------------------

# llama train_universal's case (issue #28): ds_to_universal fails at 0.1.0, and at 0.2.0 the cell gets further
# and fails in save instead, so --mode fixed finds no fix between the two.
UNIVERSAL = "def run():\n    raise KeyError('universal_checkpoint_info state is missing at step 12')\n"
SAVE = "def run():\n    raise OSError('save_16bit_model wrote 0 of 4 shards')\n"
GONE_HISTORY = [
    (
        "Initial fake DeepSpeed",
        {"fakeds/__init__.py": "", "deepspeed/__init__.py": "", "fakeds/universal.py": UNIVERSAL},
        "v0.1.0",
    ),
    ("Docs (#5001)", {"README.md": "fake\n"}, ""),
    ("Launcher (#5002)", {"fakeds/launcher.py": "RANKS = 2\n"}, ""),
    ("Keep universal checkpoint info (#5003)", {"fakeds/universal.py": SAVE}, ""),
    ("Unrelated (#5004)", {"README.md": "fake 2\n"}, "v0.2.0"),
]
GONE_CELL = textwrap.dedent("""\
    import json, re, sys
    from pathlib import Path
    cell_ids, results = sys.argv[1].split(","), Path(sys.argv[2])
    record = {"cell": {"id": cell_ids[0]}, "outcome": "pass", "failure_class": "", "signature": "", "message": ""}
    try:
        from fakeds.universal import run
        run()
    except Exception as error:
        record.update(outcome="fail", failure_class="forward" if isinstance(error, KeyError) else "numerics",
                      signature=f"{type(error).__name__}: " + re.sub(r"(?<![A-Za-z_])\\d+", "N", str(error)),
                      message=str(error))
    results.mkdir(parents=True, exist_ok=True)
    (results / "cells.jsonl").write_text(json.dumps(record) + "\\n")
""")


def test_mode_gone_finds_where_a_failure_turns_into_another(tmp_path, monkeypatch, capsys):
    import reports.search.bisect as bisect_module
    import reports.search.cell_runs as cell_runs_module

    repo, root = tmp_path / "fakeds", tmp_path / "envs"
    shas = make_repo(repo, pyproject("fakeds", include="fakeds*"), GONE_HISTORY)
    script = tmp_path / "cell.py"
    script.write_text(GONE_CELL)
    real_run_cells = cell_runs_module.run_cells
    # The real bisection with the fake package in place of DeepSpeed and the fake cell in place of `pytest suites`.
    monkeypatch.setattr(
        bisect_module,
        "commit_environment",
        lambda env_root, clone, sha, pins: EnvironmentSpec(
            key=sha[:12],
            installs=(("setuptools", "wheel"), ("--no-build-isolation", "--no-deps", str(root / sha[:12] / "src"))),
            source=(clone, sha),
        ),
    )
    monkeypatch.setattr(
        cell_runs_module,
        "run_cells",
        lambda python, cells, timeout, command: real_run_cells(
            python,
            cells,
            timeout,
            lambda python, cells, results, _: [str(python), str(script), cells[0].id, str(results)],
        ),
    )
    store = tmp_path / "history.sqlite"
    cell = CellKey("llama", "eager", "fp32", 2)
    signatures = {
        "0.1.0": ("forward", "KeyError: 'universal_checkpoint_info state is missing at step N'"),
        "0.2.0": ("numerics", "OSError: save_16bit_model wrote N of N shards"),
    }
    with HistoryStore(store, create=True) as history:
        for n, (deepspeed, failure) in enumerate(signatures.items(), start=1):
            run = Run(
                f"r{n}",
                "nightly",
                "runner-1",
                f"2026-01-0{n}T00:00:00Z",
                "cpu",
                "gloo",
                Versions(deepspeed, "5.24.0", "2.13.0+cpu", "3.11.7"),
            )
            history.import_runs([(run, [CellResult(run.run_id, cell, "fail", *failure)])], source=tmp_path)
    argv = [
        "--cell",
        cell.id,
        "--bad",
        "v0.1.0",
        "--good",
        "v0.2.0",
        "--deepspeed-repo",
        str(repo),
        "--store",
        str(store),
        "--env-root",
        str(root),
    ]

    # What fixed the first failure could not be asked for: the newer end fails too, another way.
    assert reports_main(["bisect", *argv, "--mode", "fixed"]) == 2
    err = capsys.readouterr().err
    assert f"{shas[4]} should be good but is skip (a different failure (numerics: OSError:" in err, err
    assert "--any-failure counts it as bad, --mode gone as gone)" in err

    assert reports_main(["bisect", *argv, "--mode", "gone"]) == 0
    printed = capsys.readouterr().out
    assert f"last with the failure commit {shas[2]}, first without it commit {shas[3]}" in printed
    with HistoryStore(store, create=False) as history:
        (answer,) = history.bisections()
        found = analyse(history.observations(), None, history.bisections())
    # Recorded as the class change it is, keyed on the failure that came, like triage's answers to one.
    assert (answer.kind, answer.mode, answer.failure_class, answer.commit, answer.pr) == (
        "class-change",
        "broken",
        "numerics",
        shas[3],
        5003,
    )
    assert (answer.searched_older, answer.searched_newer) == ("v0.1.0", "v0.2.0")
    (transition,) = found.transitions
    assert transition.kind == "class-change" and transition.bisection == answer


def test_mode_gone_where_the_cell_passes_is_a_fix(fake_deepspeed, fake_probe):
    from reports.search.bisect import gone_answer

    repo, shas = fake_deepspeed
    make, _ = fake_probe
    probe = make()
    probe.absent_is_good = True
    answer, commit = bisect_commits(probe.cell, GitRepo(repo), good=shas[9], bad=shas[5], mode="gone", probe=probe)
    assert (answer.before, answer.after, commit.pr) == (shas[7], shas[8], 4400)
    assert gone_answer(probe.reference, probe.runs[answer.after]) == (
        "fixed",
        "fixed",
        "shard",
        "AssertionError: heads N not divisible by N",
    )


def test_the_failure_a_gone_bisection_follows_is_its_class_and_masked_cause():
    reference = ("shard", "RuntimeError: split_sizes=[N, N] @ deepspeed/module_inject/layers.py:f")
    same_at_tp3 = CellRun("fail", "shard", reference[1].replace("[N, N]", "[N, N, N]"), "")
    assert classify(same_at_tp3, reference, False, absent_is_good=True).kind == BAD
    assert classify(CellRun("fail", "save", "OSError: x", ""), reference, False, absent_is_good=True) == Verdict(
        GOOD, "another failure (save: OSError: x)"
    )
    assert classify(CellRun("pass", "", "", ""), reference, False, absent_is_good=True).kind == GOOD
    assert classify(CellRun("fail", "install", "pip failed", ""), reference, False, absent_is_good=True).kind == SKIP
    assert classify(CellRun("skip", "", "", "needs 4 ranks"), reference, False, absent_is_good=True).kind == SKIP


# ---- repeated ends -----------------------------------------------------------------------------------------------


def test_each_end_runs_end_repeats_times_and_a_flaky_end_is_not_bisected():
    candidates = [str(i) for i in range(9)]
    calls = []
    answer = search(candidates, counting_probe(5, calls=calls), end_repeats=2)
    assert (answer.before, answer.after) == ("4", "5")
    assert calls[:4] == ["8", "8", "0", "0"] and len(calls) <= math.ceil(math.log2(9)) + 4
    queued = {"8": [Verdict(BAD, "shard: X")] * 2, "0": [Verdict(GOOD, "pass"), Verdict(BAD, "shard: X")]}
    with pytest.raises(BisectError, match=r"^0 is flaky: good \(pass\); bad \(shard: X\) in 2 runs"):
        search(candidates, lambda c: queued[c].pop(0), end_repeats=2)
    with pytest.raises(BisectError, match="--end-repeats 0: each end must run at least once"):
        search(candidates, counting_probe(5), end_repeats=0)


ALTERNATING_CELL = textwrap.dedent("""\
    # A cell whose verdict flips on every run, whatever is installed: a counter file beside the script.
    import json, sys
    from pathlib import Path
    counter = Path(__file__).with_suffix(".count")
    runs = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(runs + 1))
    record = {"cell": {"id": sys.argv[1]}, "outcome": "pass", "failure_class": "", "signature": "", "message": ""}
    if runs % 2 == 0:
        record.update(outcome="fail", failure_class="numerics", signature="logits differ by N", message="")
    Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)
    (Path(sys.argv[2]) / "cells.jsonl").write_text(json.dumps(record) + "\\n")
""")


def test_a_cell_that_alternates_is_reported_flaky_not_good_or_bad(fake_deepspeed, fake_probe, tmp_path):
    repo, shas = fake_deepspeed
    make, _ = fake_probe
    script = tmp_path / "alternating.py"
    script.write_text(ALTERNATING_CELL)
    probe, once = make(), make()
    probe.command = once.command = lambda python, cells, results, _: [
        str(python),
        str(script),
        cells[0].id,
        str(results),
    ]
    # One run per end: the first run fails at the bad end, the second passes at the good one: a "change" is found.
    answer, _ = bisect_commits(once.cell, GitRepo(repo), good="v0.1.0", bad=shas[7], mode="broken", probe=once)
    assert answer.after in shas
    (tmp_path / "alternating.count").unlink()
    with pytest.raises(
        BisectError,
        match=rf"^{shas[7]} is flaky: bad \(numerics: logits differ by N\); good \(pass\) "
        "in 2 runs; a bisection needs ends whose verdict repeats",
    ):
        bisect_commits(probe.cell, GitRepo(repo), good="v0.1.0", bad=shas[7], mode="broken", probe=probe, end_repeats=2)


def test_run_cells_reads_the_records_a_killed_session_left(tmp_path):
    """A session killed mid-write leaves its last cells.jsonl line cut short: the cells before it still
    count (the same reader as the suites' own resume), the cut one is missing from the answer."""
    from reports.search.cell_runs import run_cells

    writes = (
        "import json, sys; from pathlib import Path; results = Path(sys.argv[1]); results.mkdir(parents=True, "
        "exist_ok=True); "
        "record = {'cell': {'id': sys.argv[2]}, 'outcome': 'fail', 'failure_class': 'numerics', "
        "'signature': 'logits differ by N', 'message': ''}; "
        "(results / 'cells.jsonl').write_text(json.dumps(record) + '\\n' + '{\"cell\": {\"id\": \"llama|eag')"
    )
    first, cut = CellKey("llama", "eager", "fp32", 2), CellKey("llama", "eager", "bf16", 2)
    found = run_cells(
        Path(sys.executable),
        [first, cut],
        60,
        lambda python, cells, results, _: [str(python), "-c", writes, str(results), cells[0].id],
    )
    assert found == {first: CellRun("fail", "numerics", "logits differ by N", "")}


# ---- a failure whose function was renamed is the same failure -------------------------------------------------

STRICT = "def {name}(heads, ranks):\n    assert heads % ranks == 0, f'heads {{heads}} not divisible by {{ranks}}'\n"
RENAMED_HISTORY = [
    ("Initial fake DeepSpeed", {"fakeds/shard.py": GOOD_SHARD, "fakeds/__init__.py": "", "deepspeed/__init__.py": ""}),
    ("Check heads (#5001)", {"fakeds/shard.py": STRICT.format(name="check_heads") + "shard = check_heads\n"}),
    ("Docs (#5002)", {"README.md": "fake\n"}),
    ("Rename check_heads (#5003)",
     {"fakeds/shard.py": STRICT.format(name="require_even_heads") + "shard = require_even_heads\n"}),
    ("Release (#5004)", {"README.md": "fake 2\n"}),
]  # fmt: skip
SURFACING_CELL = textwrap.dedent("""\
    # Stands in for `pytest suites`: the signature names the function the failure surfaced in, as the harness's does.
    import json, sys, traceback
    from pathlib import Path
    cell_ids, results = sys.argv[1].split(","), Path(sys.argv[2])
    records = []
    for cell_id in cell_ids:
        record = {"cell": {"id": cell_id}, "outcome": "pass", "failure_class": "", "signature": "", "message": ""}
        try:
            from fakeds.shard import shard
            shard(6, 4)
        except AssertionError as error:
            frame = traceback.extract_tb(error.__traceback__)[-1].name
            record.update(outcome="fail", failure_class="shard",
                          signature=f"AssertionError: heads N not divisible by N @ fakeds/shard.py:{frame}",
                          message=str(error))
        records.append(json.dumps(record) + "\\n")
    results.mkdir(parents=True, exist_ok=True)
    (results / "cells.jsonl").write_text("".join(records))
""")


def test_a_function_renamed_between_releases_is_the_same_failure_and_bisects_to_one_commit(tmp_path):
    """#5001 breaks the cell in check_heads, #5003 renames it require_even_heads: the same exception and message in
    the same place, so the failure the bad end shows (require_even_heads) is the one #5001..#5002 show too, and the
    answer is #5001 alone (comparing the surfacing function, the steps before the rename were "a different failure",
    untestable, and the answer a range)."""
    repo = tmp_path / "fakeds"
    shas = make_repo(
        repo,
        pyproject("fakeds", include="fakeds*"),
        [(s, f, "v0.1.0" if not n else "") for n, (s, f) in enumerate(RENAMED_HISTORY)],
    )
    script = tmp_path / "cell.py"
    script.write_text(SURFACING_CELL)
    probe = CellProbe(
        CellKey("llama", "eager", "fp32", 2),
        env_root=tmp_path / "envs",
        environment=lambda sha: EnvironmentSpec(
            key=sha[:12],
            installs=(("setuptools", "wheel"),
                      ("--no-build-isolation", "--no-deps", str(tmp_path / "envs" / sha[:12] / "src"))),
            source=(repo, sha),
        ),
        command=lambda python, cells, results, _: [
            str(python), str(script), ",".join(c.id for c in cells), str(results)
        ],
    )  # fmt: skip
    answer, commit = bisect_commits(probe.cell, GitRepo(repo), good="v0.1.0", bad=shas[4], mode="broken", probe=probe)
    assert (answer.before, answer.after, answer.untestable) == (shas[0], shas[1], ())
    assert (commit.subject, commit.pr) == ("Check heads (#5001)", 5001)
    assert probe.reference == (
        "shard",
        "AssertionError: heads N not divisible by N @ fakeds/shard.py:require_even_heads",
    )
    renamed = {step.candidate: step for step in answer.steps}
    assert renamed[shas[1]].verdict == BAD and renamed[shas[1]].detail.endswith("fakeds/shard.py:check_heads")
