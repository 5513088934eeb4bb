"""Root causes: tp-dependent signatures read as one cause, transitions grouped into causes, and the report a
maintainer reads (first screen, support matrix per combination, timeline with version axes, report.json)."""

import pytest
from reports_testkit import Cell, fail, issue_18_store, render, section

from matrix.json_records import read_record, write_record
from reports.__main__ import main
from reports.analysis.cause_groups import CauseGroup, cause_group, cells_text
from reports.analysis.signatures import mask_signature
from reports.outputs.model import read_report
from reports.outputs.since_previous import SinceCause
from reports.store.records import CellKey

# Recorded by `nox -s matrix` (DeepSpeed 0.19.8, transformers 5.24.0, torch 2.13.0 CPU) at tp 2, 3 and 4, as the
# cells' JUnit carries them: per model, one cause at every tp.
SAME_CAUSE_AT_EVERY_TP = {
    "ctrl": [  # the half-masked shape product differs with tp
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (Nx4N and Nx4N) @ "
        "deepspeed/module_inject/layers.py:forward",
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (Nx3N and Nx3N) @ "
        "deepspeed/module_inject/layers.py:forward",
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (Nx3N and Nx3N) @ "
        "deepspeed/module_inject/layers.py:forward",
    ],
    "phimoe": [
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (Nx9N and Nx4) @ "
        "deepspeed/module_inject/layers.py:forward"
    ]
    * 3,
    "bloom": [
        "RuntimeError: The expanded size of the tensor (N) must match the existing size (N) at non-singleton "
        "dimension N.  Target sizes: [N, N, N].  Tensor sizes: [N, N, N] @ "
        "transformers/models/bloom/modeling_bloom.py:forward"
    ]
    * 3,
    # The uneven-sharding failure of DeepSpeed 0.16.9-0.18.9: the split sizes list has one entry per rank.
    "llama": [
        f"RuntimeError: split_with_sizes expects split_sizes to sum exactly to N (input tensor's size at "
        f"dimension N), but got split_sizes=[{', '.join(['N'] * tp)}] @ "
        "deepspeed/module_inject/layers.py:uneven_partition"
        for tp in (2, 3, 4)
    ],
}
# Also recorded there: tp 2 and tp 3 of these models fail in another frame or with another message, which the
# report must not merge.
DIFFERENT_CAUSES = {
    "falcon": [
        "RuntimeError: shape '[N, N, N, N]' is invalid for input of size N @ "
        "transformers/models/falcon/modeling_falcon.py:_split_heads",
        "RuntimeError: shape '[N, N, N, N]' is invalid for input of size N @ "
        "transformers/models/falcon/modeling_falcon.py:forward",
    ],
    "hunyuan_dense": [
        "RuntimeError: world_size N is larger than half of num_heads N @ "
        "deepspeed/module_inject/fusedqkv_utils.py:shard_value_with_share_qk",
        "AssertionError:  @ deepspeed/module_inject/fusedqkv_utils.py:shard_value_with_share_qk",
    ],
}


@pytest.mark.parametrize("model", SAME_CAUSE_AT_EVERY_TP)
def test_real_signatures_of_tp_2_3_4_read_as_one_cause(model):
    assert len({mask_signature(signature) for signature in SAME_CAUSE_AT_EVERY_TP[model]}) == 1


@pytest.mark.parametrize("model", DIFFERENT_CAUSES)
def test_real_signatures_of_other_failures_stay_apart(model):
    assert len({mask_signature(signature) for signature in DIFFERENT_CAUSES[model]}) == 2


def test_cause_masks_numbers_the_recording_left_and_nothing_in_words():
    assert mask_signature("AssertionError: heads 6 % tp 4 != 0") == "AssertionError: heads N % tp N != N"
    assert mask_signature("shape [24, 384] and 24x384") == "shape [N…] and N…"
    assert mask_signature("NCCL error in layers.0.mlp: None") == "NCCL error in layers.N.mlp: None"


def test_cells_are_listed_compactly():
    cells = [CellKey("llama", "eager", "fp32", tp) for tp in (3, 2, 4)] + [
        CellKey("qwen2", "eager", "fp32", 2),
        CellKey("llama", "meta", "bf16", 2),
    ]
    assert cells_text(cells) == "eager fp32: llama tp2/3/4, qwen2 tp2; meta bf16: llama tp2"


@pytest.fixture
def issue_18(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    store = issue_18_store(tmp_path)
    out = tmp_path / "out"
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    return out


def test_forty_five_fixes_of_one_cause_are_one_root_cause(issue_18):
    report = (issue_18 / "report.md").read_text()
    url = "https://github.com/deepspeedai/DeepSpeed"
    fixes = section(report, "Root causes")[4:]
    assert fixes[0] == "### Fixes: 1 cause, 45 cells"
    assert fixes[1].startswith(
        "1. shard: init_inference fails to shard it in layers.py `RuntimeError: split_with_sizes expects split_sizes "
        "to sum exactly to N (input tensor's size at "
        "dimension N), but got split_sizes=[N…] @ deepspeed/module_inject/layers.py:uneven_partition` — deepspeed "
        "0.18.9 → 0.19.8 — 45 cells: eager fp32: codegen tp2/3, cohere tp2/3, gemma tp2/3, gemma2 tp2/3, gemma3 tp2,"
    )
    assert fixes[2:] == [  # the answer triage found on llama tp2 and confirmed on 43 cells, stated once
        f"   - answer (44 cells): fixed at deepspeed 0.19.5 → 0.19.6, first good commit [8185818581]({url}/commit/"
        f'{"8185" * 10}) ([#8185]({url}/pull/8185) "Fix uneven sharding of split sizes")',
        "   - answer (1 cell: eager fp32: cohere tp3): not yet triaged",
    ]
    # Provenance once, where the section starts; a cause names only the pins that differ from it.
    assert report.count("python 3.11.7") == 1 + 4  # the latest versions, then the four matrices' labels


def test_first_screen_says_what_changed_since_the_previous_run(issue_18):
    report = (issue_18 / "report.md").read_text()
    assert section(report, "Since the previous run of each session") == [
        "3 new failures in 1 cause.",
        "- `nightly`: run `nightly@2026-12-03T00:00:00Z@vm` → `nightly@2026-12-04T00:00:00Z@vm`: "
        "transformers 5.23.0 → 5.24.0",
        "- **new failure** forward: its forward fails on a tensor whose size the split changed `RuntimeError: The "
        "expanded size of the tensor (N) must match the existing size (N) at non-singleton dimension N. Target sizes: "
        "[N…]. Tensor sizes: [N…] @ "
        "transformers/models/bloom/modeling_bloom.py:forward` — 3 cells: eager fp32: bloom tp2/3/4 — "
        "transformers 5.23.0 → 5.24.0: answer: not yet triaged",
    ]
    first_screen = report.split("## Support matrix at the latest versions", 1)[0]
    # was 75 bullet lines of cells before root causes; "Failing now, by cause" (6 lines here) comes first
    assert len(first_screen.splitlines()) < 36
    summary = (issue_18 / "step-summary.md").read_text()
    # the step summary leads with the answer (#55): what changed since the previous trusted run, one row per cause;
    # the history's root causes (the 45 fixes) stay in report.md
    assert "- Since the previous trusted run: 3 new failures in 1 cause." in summary
    assert "### Fixes: 1 cause, 45 cells" not in summary and "### Fixes: 1 cause, 45 cells" in report
    assert "<details>" not in summary  # no per-cell detail in the step summary


def test_report_json_keeps_the_groups_matrices_and_timeline_axes(issue_18):
    data = read_report(issue_18)
    regression, fix = data.root_causes
    assert (fix.kind, fix.axis, fix.before, fix.after, fix.group.failure_class, fix.group.count) == (
        "fixed",
        "deepspeed",
        "0.18.9",
        "0.19.8",
        "shard",
        45,
    )
    assert fix.held_fixed == ((("transformers", "5.24.0"), ("torch", "2.13.0+cpu"), ("python", "3.11.7")),)
    assert fix.elsewhere == ()  # held at the latest versions: the report states them once
    assert tuple(sorted(data.fixes[i].cell.id for i in fix.members)) == fix.group.cells
    assert [(a.answer.split(",")[0], len(a.cells)) for a in fix.answers] == [
        ("fixed at deepspeed 0.19.5 → 0.19.6", 44),
        ("not yet triaged", 1),
    ]
    assert regression.group.cells == tuple(f"bloom-eager-fp32-tp{tp}" for tp in (2, 3, 4))

    since = data.since_previous_run
    assert since.counts == {
        "new failure": {"cells": 3, "causes": 1},
        "fixed": {"cells": 0, "causes": 0},
        "still failing": {"cells": 0, "causes": 0},
        "flaky": {"cells": 0},
    }
    assert since.causes[0].root_causes == (regression.id,)

    assert [m.label for m in data.matrices] == [  # every combination, the newest first
        f"deepspeed {ds}, transformers {tf}, torch 2.13.0+cpu, python 3.11.7"
        for ds, tf in (("0.19.8", "5.24.0"), ("0.19.8", "5.23.0"), ("0.18.9", "5.24.0"), ("0.17.6", "5.24.0"))
    ]
    assert data.matrices[2].matrix.counts["shard"]["all"] == 45

    timeline = data.timeline
    assert (timeline.primary_axis, timeline.varying_axes) == ("deepspeed", ("deepspeed", "transformers"))
    assert timeline.fixed_axes == {"torch": "2.13.0+cpu", "python": "3.11.7"}
    assert [(c.group, c.label) for c in timeline.columns] == [
        ("transformers 5.23.0", "0.19.8"),
        ("transformers 5.24.0", "0.17.6"),
        ("transformers 5.24.0", "0.18.9"),
        ("transformers 5.24.0", "0.19.8"),
    ]
    steady = {cell.cell.id for cell in timeline.cells if not cell.changed}
    assert len(steady) == 72 - 48 and "llama-eager-fp32-tp4" in steady and "gemma3-eager-fp32-tp3" in steady


def test_a_cause_seen_away_from_the_latest_versions_says_where(session, tmp_path):
    session([Cell("llama"), Cell("llama", tp=3)], transformers="4.57.6", deepspeed="0.18.9")
    session(
        [fail("llama", "shard", "split_sizes=[N, N]"), fail("llama", "shard", "split_sizes=[N, N, N]", tp=3)],
        transformers="4.57.6",
        deepspeed="0.19.0",
    )
    session([Cell("llama")], transformers="5.24.0", deepspeed="0.19.0")
    report = (render(tmp_path / "junit", tmp_path) / "report.md").read_text()
    assert (
        "1. shard: init_inference fails to shard it `split_sizes=[N…]` — deepspeed 0.18.9 → 0.19.0 at transformers "
        "4.57.6 — 2 cells: eager fp32: "
        "llama tp2/3" in report
    )


def test_a_cause_views_group_is_written_in_its_place_under_report_jsons_keys():
    """A view holds its cells as one CauseGroup; report.json has always had their fields in the view's own object
    (the masked signature as `cause`), so reports written before read back and are written again key for key."""
    cells = [CellKey("a", "eager", "fp32", 3), CellKey("a", "eager", "fp32", 2)]
    group = cause_group("shard", "AssertionError: N heads", cells)
    assert group == CauseGroup(
        "shard", "AssertionError: N heads", 2, ("a-eager-fp32-tp2", "a-eager-fp32-tp3"), "eager fp32: a tp2/3"
    )
    stored = {
        "id": "0123456789ab",
        "kind": "new failure",
        "failure_class": "shard",
        "cause": "AssertionError: N heads",
        "count": 2,
        "cells": ["a-eager-fp32-tp2", "a-eager-fp32-tp3"],
        "cells_text": "eager fp32: a tp2/3",
        "sessions": ["nightly"],
        "no_previous_verdict": [],
        "root_causes": [],
    }
    since = read_record(SinceCause, stored)
    assert since.group == group
    written = write_record(since)
    assert written == stored and list(written) == list(stored)
