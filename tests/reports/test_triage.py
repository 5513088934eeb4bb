"""reports.search.triage on real git repositories of fake packages, installed per commit into real environments:
grouping into questions, one bisection per question, confirmation of the others, the budget, the
transformers side's suspect commits, and the answer lines the report prints."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from reports.analysis.answers import answer_text, plain_link
from reports.analysis.history import analyse
from reports.clones.git import GitRepo
from reports.outputs.model import transition_entry
from reports.search.triage import Budget, Installer, Triage, questions
from reports.store.history_store import HistoryStore
from reports.store.records import CellKey, CellResult, Run, Versions
from sessions.environments import EnvironmentSpec
from tests.fake_packages import git, make_repo, pyproject

# ---- fake packages in git ----------------------------------------------------------------------------------------


def fake_installer(root: Path, repos: dict[str, Path]) -> Installer:
    """Releases are the repositories' tags; every candidate is the one fake package built from its commit."""

    def commit(axis: str, clone: GitRepo, sha: str, pins: dict[str, str]) -> EnvironmentSpec:
        source = str(root / sha[:12] / "src")
        return EnvironmentSpec(
            key=sha[:12],
            installs=(("setuptools", "wheel"), ("--no-build-isolation", "--no-deps", source)),
            source=(clone.path, sha),
        )

    def release(pins: dict[str, str]) -> EnvironmentSpec:
        axis = next(iter(repos))
        clone = GitRepo(repos[axis], f"--{axis}-repo")
        return commit(axis, clone, clone.resolve(pins[axis]), pins)

    def releases(axis: str, older: str, newer: str) -> list[str]:
        tags = git(repos[axis], "tag", "--sort=v:refname").split()
        versions = [tag.removeprefix("v") for tag in tags]
        return versions[versions.index(older) : versions.index(newer) + 1]

    return Installer(releases=releases, release=release, commit=commit)


# Stands in for `pytest suites`: runs the cells against the installed fake package, writes cells.jsonl.
FAKE_CELLS = textwrap.dedent("""\
    import json, re, sys, traceback
    from pathlib import Path
    cell_ids, results = sys.argv[1].split(","), Path(sys.argv[2])
    lines = []
    for cell_id in cell_ids:
        tp = int(cell_id.rsplit("-tp", 1)[1])
        record = {"cell": {"id": cell_id}, "outcome": "pass", "failure_class": "", "signature": "", "message": ""}
        if cell_id.startswith("steady-"):  # a model the change does not reach
            lines.append(json.dumps(record) + "\\n")
            continue
        try:
            from MODULE import run
            run(tp)
            if cell_id.startswith("masked-"):  # a model that fails later on when the change is absent
                raise ArithmeticError("logits differ by 3")
        except Exception as error:
            frame = traceback.extract_tb(error.__traceback__)[-1]
            where = frame.filename.split("site-packages/")[-1] if "site-packages/" in frame.filename else ""
            text = re.sub(r"\\d+", "N", str(error))
            failure_class = "numerics" if isinstance(error, ArithmeticError) else "FAILURE_CLASS"
            record.update(outcome="fail", failure_class=failure_class,
                          signature=f"{type(error).__name__}: {text} @ {where}:{frame.name}",
                          message="".join(traceback.format_exception(error)))
        lines.append(json.dumps(record) + "\\n")
    results.mkdir(parents=True, exist_ok=True)
    (results / "cells.jsonl").write_text("".join(lines))
""")


def cells_command(script: Path):
    return lambda python, cells, results, timeout: [
        str(python),
        str(script),
        ",".join(c.id for c in cells),
        str(results),
    ]


def write_store(store: Path, cells: list[CellKey], points: list[tuple[Versions, dict[CellKey, tuple[str, str]]]]):
    """points: versions and, per cell, (failure class, signature) or absent for a pass."""
    with HistoryStore(store, create=True) as history:
        for n, (versions, failures) in enumerate(points):
            run = Run(f"nightly@{n}", "nightly", "runner-1", f"2026-01-0{n + 1}T00:00:00Z", "cpu", "gloo", versions)
            results = [
                CellResult(
                    run.run_id,
                    cell,
                    "fail" if cell in failures else "pass",
                    *failures.get(cell, ("", "")),
                    message=failures.get(cell, ("", ""))[1],
                )
                for cell in cells
            ]
            history.import_runs([(run, results)], source=store.parent)


def answers(store: Path) -> list[tuple[str, str]]:
    """(cell id, line) of each transition, the line as the report prints it."""
    with HistoryStore(store, create=False) as history:
        found = analyse(history.observations(), None, history.bisections(), history.triage_attempts())
    return [(t.cell.id, answer_text(transition_entry(t), plain_link)) for t in found.transitions]


# ---- DeepSpeed side: one bad commit behind 11 red cells of two causes ---------------------------------------------

GOOD_SHARD = "def run(tp):\n    return [6 // tp] * tp\n"
BAD_SHARD = textwrap.dedent("""\
    def run(tp):
        if tp == 3:
            raise ValueError(f"cannot place {6 % tp} leftover heads")
        sizes = [6 // tp] * tp
        raise AssertionError(f"split_sizes={sizes} must sum to 7")
""")
DEEPSPEED_HISTORY = [
    (
        "Initial fake DeepSpeed",
        {"fakeds/__init__.py": "", "deepspeed/__init__.py": "", "fakeds/shard.py": GOOD_SHARD},
        "v0.1.0",
    ),
    ("Docs (#4001)", {"README.md": "fake\n"}, "v0.1.1"),
    ("Refactor the launcher (#4002)", {"fakeds/launcher.py": "RANKS = 2\n"}, ""),
    ("Shard heads strictly (#4321)", {"fakeds/shard.py": BAD_SHARD}, ""),
    ("Unrelated (#4322)", {"README.md": "fake 2\n"}, "v0.2.0"),
]
MODELS = ("llama", "qwen2", "mistral", "gemma", "phi")
TP2_CAUSE = "AssertionError: split_sizes=[N, N] must sum to N @ fakeds/shard.py:run"
TP3_CAUSE = "ValueError: cannot place N leftover heads @ fakeds/shard.py:run"


@pytest.fixture(scope="module")
def deepspeed_side(tmp_path_factory):
    """The fake DeepSpeed repository, its environments (kept across tests) and the cell script."""
    root = tmp_path_factory.mktemp("triage-ds")
    repo = root / "fakeds-repo"
    repo.mkdir()
    shas = make_repo(repo, pyproject("fakeds", include="fakeds*"), DEEPSPEED_HISTORY)
    script = root / "cells.py"
    script.write_text(FAKE_CELLS.replace("MODULE", "fakeds.shard").replace("FAILURE_CLASS", "shard"))
    return repo, shas, root / "envs", script


def red_cells_store(store: Path) -> list[CellKey]:
    """11 cells green at 0.1.0 and red at 0.2.0: tp2 and tp4 (one cause: only the list length differs), tp3."""
    cells = [CellKey(model, "eager", "fp32", tp) for model in MODELS for tp in (2, 3)]
    cells.append(CellKey("llama", "eager", "fp32", 4))
    signatures = {2: TP2_CAUSE, 3: TP3_CAUSE, 4: TP2_CAUSE.replace("[N, N]", "[N, N, N, N]")}
    fixed = dict(transformers="5.24.0", torch="2.13.0+cpu", python="3.11.7")
    write_store(
        store,
        cells,
        [
            (Versions("0.1.0", **fixed), {}),
            (Versions("0.2.0", **fixed), {c: ("shard", signatures[c.tp]) for c in cells}),
        ],
    )
    return cells


def make_triage(store: Path, deepspeed_side, budget: Budget) -> Triage:
    repo, _, envs, script = deepspeed_side
    return Triage(
        store,
        envs,
        fake_installer(envs, {"deepspeed": repo}),
        budget,
        {"deepspeed": GitRepo(repo)},
        command=cells_command(script),
        cell_timeout=60,
    )


def test_one_bad_commit_behind_eleven_cells_is_two_bisections(deepspeed_side, tmp_path, capsys):
    _, shas, _, _ = deepspeed_side
    store = tmp_path / "history.sqlite"
    cells = red_cells_store(store)
    with HistoryStore(store, create=False) as history:
        found = analyse(history.observations(), None)
    assert sorted(len(q.transitions) for q in questions(found.transitions)) == [5, 6]  # tp4 joins tp2's cause

    triage = make_triage(store, deepspeed_side, Budget(max_cells=100, max_minutes=30))
    assert triage.run(found.transitions) == []
    assert (triage.answered, triage.confirmed) == (2, 9)
    # The first question: 3 release steps (0.1.1 lies between 0.1.0 and 0.2.0), then 4 commit steps (v0.1.1,
    # two commits and v0.2.0: both ends again, as source builds are not the release's build, then two between).
    # The second tries the first one's answers first: 2 runs at each level.
    assert triage.steps == 7 + 4
    with HistoryStore(store, create=False) as history:
        bisections = history.bisections()
    assert {b.cell for b in bisections} == set(cells)
    assert {(b.before, b.after, b.commit, b.pr) for b in bisections} == {("0.1.1", "0.2.0", shas[3], 4321)}
    representatives = {b.cell.id for b in bisections if not b.confirmed_from}
    assert representatives == {"gemma-eager-fp32-tp2", "gemma-eager-fp32-tp3"}  # smallest tp, then name
    assert {b.confirmed_from for b in bisections if b.confirmed_from} == representatives

    lines = dict(answers(store))
    assert lines["llama-eager-fp32-tp4"] == (
        f'llama tp4 eager fp32: broke at deepspeed 0.1.1 → 0.2.0, first bad commit {shas[3][:10]} (#4321 "Shard '
        f'heads strictly"), shard: {TP2_CAUSE.replace("[N, N]", "[N, N, N, N]")} (confirmed here; bisected on '
        "gemma-eager-fp32-tp2)"
    )
    assert all("#4321" in line for line in lines.values())
    printed = capsys.readouterr().out
    assert "triage: 11 open transition(s) in 2 question(s)" in printed


def test_a_budget_that_stops_half_way_leaves_the_rest_not_yet_triaged(deepspeed_side, tmp_path):
    store = tmp_path / "history.sqlite"
    red_cells_store(store)
    with HistoryStore(store, create=False) as history:
        found = analyse(history.observations(), None)
    # The larger question takes 7 steps + 5 cells at each end of the answer = 17 cell runs; then it stops.
    triage = make_triage(store, deepspeed_side, Budget(max_cells=17, max_minutes=30))
    left = triage.run(found.transitions)
    assert [len(q.transitions) for q in left] == [5] and left[0].cause == TP3_CAUSE
    lines = dict(answers(store))
    untriaged = sorted(cell for cell, line in lines.items() if "not yet triaged" in line)
    assert untriaged == sorted(f"{model}-eager-fp32-tp3" for model in MODELS)
    assert all("#4321" in line for cell, line in lines.items() if cell not in untriaged)

    # The next triage picks up exactly what was left.
    with HistoryStore(store, create=False) as history:
        found = analyse(history.observations(), None, history.bisections())
    again = make_triage(store, deepspeed_side, Budget(max_cells=100, max_minutes=30))
    assert again.run(found.transitions) == [] and (again.answered, again.confirmed) == (1, 4)
    assert not any("not yet triaged" in line for _, line in answers(store))


def test_a_cell_that_does_not_confirm_gets_its_own_question_and_unanswerable_ones_say_why(deepspeed_side, tmp_path):
    store = tmp_path / "history.sqlite"
    llama, steady, qwen2 = (CellKey(model, "eager", "fp32", 2) for model in ("llama", "steady", "qwen2"))
    fixed = dict(transformers="5.24.0", python="3.11.7")
    write_store(
        store,
        [llama, steady, qwen2],
        [
            (Versions("0.1.0", torch="2.13.0+cpu", **fixed), {}),
            # steady was recorded red with llama's cause but passes whenever it runs (the fake's "steady" model);
            # qwen2's recorded failure is one the fake never produces.
            (
                Versions("0.2.0", torch="2.13.0+cpu", **fixed),
                {llama: ("shard", TP2_CAUSE), steady: ("shard", TP2_CAUSE), qwen2: ("numerics", "logits differ")},
            ),
            (Versions("0.2.0", torch="2.12.0", **fixed), {}),  # a torch transition: not bisected, says why
        ],
    )
    with HistoryStore(store, create=False) as history:
        found = analyse(history.observations(), None)
    triage = make_triage(store, deepspeed_side, Budget(max_cells=100, max_minutes=30))
    assert triage.run(found.transitions) == []
    assert (triage.answered, triage.confirmed) == (1, 0)
    lines = [line for _, line in answers(store)]
    assert any(
        line.startswith("llama tp2 eager fp32: broke at deepspeed 0.1.1 → 0.2.0, first bad commit") for line in lines
    )
    steady_line = next(line for line in lines if line.startswith("steady tp2 eager fp32: broke at deepspeed"))
    assert "triage could not answer: 0.2.0 should be bad but is good" in steady_line
    qwen2_line = next(line for line in lines if line.startswith("qwen2 tp2 eager fp32: broke at deepspeed"))
    assert "triage could not answer: 0.2.0 should be bad but is skip (a different failure (shard:" in qwen2_line
    torch_lines = [line for line in lines if " at torch " in line]
    assert len(torch_lines) == 3 and all("a torch change is shown with its range only" in line for line in torch_lines)
    # Asking again records nothing new: each reason is kept once.
    with HistoryStore(store, create=False) as history:
        attempts = len(history.triage_attempts())
        found = analyse(history.observations(), None, history.bisections(), history.triage_attempts())
    make_triage(store, deepspeed_side, Budget(max_cells=100, max_minutes=30)).run(found.transitions)
    with HistoryStore(store, create=False) as history:
        assert len(history.triage_attempts()) == attempts


def test_a_class_change_is_bisected_from_its_old_failure_to_its_new_one(deepspeed_side, tmp_path):
    _, shas, _, _ = deepspeed_side
    store = tmp_path / "history.sqlite"
    masked = [CellKey("masked", "eager", "fp32", tp) for tp in (2, 3)]
    old = "ArithmeticError: logits differ by N @ :<module>"  # what the fake records for the old failure
    fixed = dict(transformers="5.24.0", torch="2.13.0+cpu", python="3.11.7")
    write_store(
        store,
        masked,
        [
            (Versions("0.1.0", **fixed), {c: ("numerics", old) for c in masked}),
            (
                Versions("0.2.0", **fixed),
                {masked[0]: ("shard", TP2_CAUSE), masked[1]: ("shard", TP2_CAUSE.replace("[N, N]", "[N, N, N]"))},
            ),
        ],
    )
    with HistoryStore(store, create=False) as history:
        found = analyse(history.observations(), None)
    assert [t.kind for t in found.transitions] == ["class-change", "class-change"]
    # masked tp3 fails with tp3's ValueError in the fake, not the recorded cause: it confirms nothing.
    triage = make_triage(store, deepspeed_side, Budget(100, 30))
    assert triage.run(found.transitions) == []
    lines = dict(answers(store))
    assert lines["masked-eager-fp32-tp2"].startswith(
        "masked tp2 eager fp32: failure class changed at deepspeed 0.1.0 → 0.2.0: numerics → shard: AssertionError: "
        f"split_sizes=[N, N] must sum to N @ fakeds/shard.py:run (changed at deepspeed 0.1.1 → 0.2.0, first changed "
        f'commit {shas[3][:10]} (#4321 "Shard heads strictly"))'
    )
    assert "triage could not answer" in lines["masked-eager-fp32-tp3"]


# ---- transformers side: the commit that touched the failing frame's file comes first ------------------------------

MODELING = "def run(tp):\n    return tp\n"
BROKEN_MODELING = "def run(tp):\n    raise TypeError(f'forward() got {tp} unexpected heads')\n"
TRANSFORMERS_HISTORY = [
    (
        "Initial fake transformers",
        {
            "src/transformers/__init__.py": "",
            "src/transformers/models/__init__.py": "",
            "src/transformers/models/llama/__init__.py": "",
            "src/transformers/models/llama/modeling_llama.py": MODELING,
            "src/transformers/models/bert/__init__.py": "",
        },
        "v5.0.0",
    ),
    ("Llama config tweak (#40101)", {"src/transformers/models/llama/configuration_llama.py": "X = 1\n"}, ""),
    ("Refactor llama attention (#40102)", {"src/transformers/models/llama/modeling_llama.py": BROKEN_MODELING}, ""),
    ("Bert docs (#40103)", {"src/transformers/models/bert/notes.py": "Y = 1\n"}, ""),
    ("Llama exports (#40104)", {"src/transformers/models/llama/__init__.py": "Z = 1\n"}, "v5.1.0"),
]


def test_transformers_side_lists_the_frame_file_commit_first_and_bisects_commits(tmp_path):
    repo = tmp_path / "transformers-repo"
    repo.mkdir()
    shas = make_repo(repo, pyproject("transformers", "src"), TRANSFORMERS_HISTORY)
    script = tmp_path / "cells.py"
    script.write_text(
        FAKE_CELLS.replace("MODULE", "transformers.models.llama.modeling_llama").replace("FAILURE_CLASS", "forward")
    )
    store = tmp_path / "history.sqlite"
    cell = CellKey("llama", "eager", "fp32", 2)
    signature = "TypeError: forward() got N unexpected heads @ transformers/models/llama/modeling_llama.py:run"
    write_store(
        store,
        [cell],
        [
            (Versions("0.19.8", "5.0.0", "2.13.0+cpu", "3.11.7"), {}),
            (Versions("0.19.8", "5.1.0", "2.13.0+cpu", "3.11.7"), {cell: ("forward", signature)}),
        ],
    )
    with HistoryStore(store, create=False) as history:
        found = analyse(history.observations(), None)
    envs = tmp_path / "envs"
    triage = Triage(
        store,
        envs,
        fake_installer(envs, {"transformers": repo}),
        Budget(50, 30),
        {"transformers": GitRepo(repo, "--transformers-repo")},
        command=cells_command(script),
        model_types={"llama": "llama"},
    )
    assert triage.run(found.transitions) == []
    with HistoryStore(store, create=False) as history:
        (answer,) = history.bisections()
    assert [s.pr for s in answer.suspects] == [40102, 40104, 40101]  # the frame's file, then the folder, newest first
    assert answer.suspects[0].files == ("src/transformers/models/llama/modeling_llama.py",)
    assert (answer.commit, answer.pr, answer.axis) == (shas[2], 40102, "transformers")
    ((_, line),) = answers(store)
    assert line.startswith(
        f"llama tp2 eager fp32: broke at transformers 5.0.0 → 5.1.0, first bad commit {shas[2][:10]} "
        '(#40102 "Refactor llama attention"), forward: TypeError'
    )


def test_refine_bisects_the_commits_behind_a_release_level_answer(deepspeed_side, tmp_path):
    _, shas, _, _ = deepspeed_side
    store = tmp_path / "history.sqlite"
    red_cells_store(store)
    with HistoryStore(store, create=False) as history:
        found = analyse(history.observations(), None)
    repo, _, envs, script = deepspeed_side
    release_only = Triage(
        store, envs, fake_installer(envs, {"deepspeed": repo}), Budget(100, 30), command=cells_command(script)
    )  # no clone: releases only
    assert release_only.run(found.transitions) == [] and release_only.steps == 3 + 2
    lines = [line for _, line in answers(store)]
    assert all("first bad commit" not in line and "0.1.1 → 0.2.0" in line for line in lines), lines

    with HistoryStore(store, create=False) as history:
        found = analyse(history.observations(), None, history.bisections())
    refined = make_triage(store, deepspeed_side, Budget(100, 30))
    assert refined.run(found.transitions) == []  # without --refine, every transition is answered already
    assert refined.steps == 0
    assert refined.run(found.transitions, refine=True) == []
    assert refined.steps == 4 + 2  # the stored release answer is reused: commit steps only
    assert all(f"first bad commit {shas[3][:10]}" in line for _, line in answers(store))


def test_frame_files_and_causes_read_real_signatures():
    from reports.analysis.signatures import frame_files, mask_signature

    tp2 = (
        "RuntimeError: split_with_sizes expects split_sizes to sum exactly to N (input tensor's size at dimension "
        "N), but got split_sizes=[N, N] @ deepspeed/module_inject/layers.py:uneven_partition"
    )
    tp3 = tp2.replace("[N, N]", "[N, N, N]")
    assert mask_signature(tp2) == mask_signature(tp3) != mask_signature(tp2.replace("RuntimeError", "ValueError"))
    message = (
        'Traceback (most recent call last):\n  File "/x/site-packages/transformers/models/bloom/modeling_bloom.py",'
        ' line 10, in forward\n  File "/x/site-packages/transformers/modeling_utils.py", line 5, in f\n'
    )
    signature = "TypeError: boom @ transformers/integrations/tensor_parallel.py:shard"
    assert frame_files(signature, message) == [
        "transformers/integrations/tensor_parallel.py",
        "transformers/modeling_utils.py",
        "transformers/models/bloom/modeling_bloom.py",
    ]


def test_a_class_change_takes_its_suspects_from_the_new_failures_traceback(tmp_path):
    """The old failure's traceback names bert's notes.py (touched by #40103); the new failure's names llama's
    modeling file only. The suspects come from the new failure: #40103 is not one of them."""
    from reports.search.steps import Answer

    repo = tmp_path / "transformers-repo"
    repo.mkdir()
    make_repo(repo, pyproject("transformers", "src"), TRANSFORMERS_HISTORY)
    store = tmp_path / "history.sqlite"
    cell = CellKey("llama", "eager", "fp32", 2)
    old_traceback = (
        'Traceback (most recent call last):\n  File "/x/site-packages/transformers/models/bert/notes.py", '
        "line 1, in <module>\nArithmeticError: logits differ by 3\n"
    )
    new_signature = "TypeError: forward() got N unexpected heads @ transformers/models/llama/modeling_llama.py:run"
    with HistoryStore(store, create=True) as history:
        for n, (transformers, failure) in enumerate(
            [
                (
                    "5.0.0",
                    (
                        "numerics",
                        "ArithmeticError: logits differ by N @ transformers/models/bert/notes.py:<module>",
                        old_traceback,
                    ),
                ),
                ("5.1.0", ("forward", new_signature, new_signature)),
            ]
        ):
            run = Run(
                f"nightly@{n}",
                "nightly",
                "runner-1",
                f"2026-01-0{n + 1}T00:00:00Z",
                "cpu",
                "gloo",
                Versions("0.19.8", transformers, "2.13.0+cpu", "3.11.7"),
            )
            history.import_runs([(run, [CellResult(run.run_id, cell, "fail", *failure)])], source=tmp_path)
        found = analyse(history.observations(), None)
    (question,) = questions(found.transitions)
    assert question.kind == "class-change"
    triage = Triage(
        store,
        tmp_path / "envs",
        fake_installer(tmp_path / "envs", {"transformers": repo}),
        Budget(1, 1),
        model_types={"llama": "llama"},
    )
    suspects = triage.suspects(
        GitRepo(repo, "--transformers-repo"), Answer("5.0.0", "5.1.0", (), ()), question, question.representative
    )
    assert [s.pr for s in suspects] == [40102, 40104, 40101]


def test_a_git_error_leaves_its_question_unanswered_with_the_reason_and_triage_goes_on(tmp_path):
    """The clone lacks the tag of 5.2.0 (not fetched): each question that needs it is recorded as unanswerable,
    naming the missing tag, and the run goes on to the next question instead of stopping at the first."""
    from dataclasses import replace

    repo = tmp_path / "transformers-repo"
    repo.mkdir()
    make_repo(repo, pyproject("transformers", "src"), TRANSFORMERS_HISTORY)  # tags v5.0.0 and v5.1.0 only
    store = tmp_path / "history.sqlite"
    llama, qwen2 = CellKey("llama", "eager", "fp32", 2), CellKey("qwen2", "eager", "fp32", 2)
    write_store(
        store,
        [llama, qwen2],
        [
            (Versions("0.19.8", "5.1.0", "2.13.0+cpu", "3.11.7"), {qwen2: ("numerics", "logits differ")}),
            (Versions("0.19.8", "5.2.0", "2.13.0+cpu", "3.11.7"), {llama: ("forward", "TypeError: boom")}),
        ],
    )
    with HistoryStore(store, create=False) as history:
        found = analyse(history.observations(), None)
    assert len(questions(found.transitions)) == 2
    envs = tmp_path / "envs"
    adjacent = replace(fake_installer(envs, {"transformers": repo}), releases=lambda axis, older, newer: [older, newer])
    triage = Triage(store, envs, adjacent, Budget(50, 30), {"transformers": GitRepo(repo, "--transformers-repo")})
    assert triage.run(found.transitions) == []
    with HistoryStore(store, create=False) as history:
        attempts = history.triage_attempts()
        assert history.bisections() == []
    assert sorted((a.cell.model, a.mode) for a in attempts) == [("llama", "broken"), ("qwen2", "fixed")]
    assert all("--transformers-repo" in a.reason and "no commit or tag '5.2.0'" in a.reason for a in attempts)
    assert all("triage could not answer: --transformers-repo" in line for _, line in answers(store))


def test_refine_that_finds_no_commit_records_nothing_new(tmp_path):
    """A release-level answer refined with a clone whose commits cannot be bisected (its tags were never
    fetched) stays the one stored answer: no second, identical row."""
    from reports.store.records import Bisection

    repo = tmp_path / "fakeds-repo"
    repo.mkdir()
    make_repo(
        repo, pyproject("fakeds", include="fakeds*"), [(subject, files, "") for subject, files, _ in DEEPSPEED_HISTORY]
    )
    store = tmp_path / "history.sqlite"
    cell = CellKey("llama", "eager", "fp32", 2)
    fixed = dict(transformers="5.24.0", torch="2.13.0+cpu", python="3.11.7")
    write_store(
        store, [cell], [(Versions("0.1.0", **fixed), {}), (Versions("0.2.0", **fixed), {cell: ("shard", TP2_CAUSE)})]
    )
    with HistoryStore(store, create=True) as history:
        (transition,) = analyse(history.observations(), None).transitions
        history.add_bisection(
            Bisection(
                cell,
                "broken",
                "deepspeed",
                "0.1.1",
                "0.2.0",
                transition.held_fixed,
                "shard",
                TP2_CAUSE,
                recorded_at="2026-01-03T00:00:00+00:00",
                kind="broke",
                searched_older="0.1.0",
                searched_newer="0.2.0",
            )
        )
        found = analyse(history.observations(), None, history.bisections())
    assert found.transitions[0].bisection is not None
    envs = tmp_path / "envs"
    triage = Triage(
        store, envs, fake_installer(envs, {"deepspeed": repo}), Budget(50, 30), {"deepspeed": GitRepo(repo)}
    )
    assert triage.run(found.transitions, refine=True) == []
    with HistoryStore(store, create=False) as history:
        assert len(history.bisections()) == 1
    assert triage.answered == 0


def test_the_same_question_at_other_held_fixed_versions_is_recorded_for_each(deepspeed_side, tmp_path):
    """One torch change seen at DeepSpeed 0.1.0 and again at 0.2.0: two questions, each recorded once with its
    reason, so neither transition is left "not yet triaged"."""
    store = tmp_path / "history.sqlite"
    cell = CellKey("llama", "eager", "fp32", 2)
    write_store(
        store,
        [cell],
        [
            (Versions(deepspeed, "5.24.0", torch, "3.11.7"), failures)
            for deepspeed in ("0.1.0", "0.2.0")
            for torch, failures in (("2.12.0", {}), ("2.13.0+cpu", {cell: ("shard", "boom")}))
        ],
    )
    for _ in range(2):  # asking again records nothing new
        with HistoryStore(store, create=False) as history:
            found = analyse(history.observations(), None, history.bisections(), history.triage_attempts())
        assert [t.held_fixed[0] for t in found.transitions] == [("deepspeed", "0.1.0"), ("deepspeed", "0.2.0")]
        make_triage(store, deepspeed_side, Budget(max_cells=10, max_minutes=30)).run(found.transitions)
        with HistoryStore(store, create=False) as history:
            assert sorted(a.held_fixed[0] for a in history.triage_attempts()) == [
                ("deepspeed", "0.1.0"),
                ("deepspeed", "0.2.0"),
            ]
    lines = [line for _, line in answers(store)]
    assert len(lines) == 2 and all("a torch change is shown with its range only" in line for line in lines), lines
