"""The harness's causes agree with a labelling of every failing cell of the default matrix by mechanism, made by
reading DeepSpeed's and transformers' code at each failing line (data/default_matrix_mechanisms.toml, with the
file:function evidence per mechanism): no cause holds two mechanisms, no mechanism is two causes.

The harness's side is what the ranks recorded for those cells in a real `nox -s matrix` run (DeepSpeed 0.19.8,
transformers 5.25.0): each failing cell's class, signature, AutoTP record and break point
(data/default_matrix_failures.json), given to suites/mechanism.py `cause_of` here. After a change to what the ranks
record, run the default matrix and refresh the file from its results:

    python -c "from tests.suites.test_default_matrix_causes import write_failures; write_failures('results')"
"""

import json
from collections import defaultdict
from pathlib import Path

import tomllib

from matrix.json_records import read_record
from suites.mechanism import AutoTPRecord, BreakPoint, Failure, cause_of
from suites.records.run_records import read_records

DATA = Path(__file__).parent / "data"
LABELS = DATA / "default_matrix_mechanisms.toml"
FAILURES = DATA / "default_matrix_failures.json"


def short_id(cell: dict) -> str:
    """`olmo2.faithful-tp2`: the default matrix is eager fp32 only."""
    return f"{cell['model']}-tp{cell['tp']}"


def write_failures(results: str) -> None:
    """The newest run's failing cells of `results`/cells.jsonl as the fixture keeps them."""
    records = read_records(Path(results))
    newest = records[-1]["run"]["id"]
    failing = [r for r in records if r["run"]["id"] == newest and r["outcome"] == "fail"]
    kept = {
        short_id(r["cell"]): {key: r.get(key) for key in ("failure_class", "signature", "autotp", "broke_at")}
        for r in failing
    }
    FAILURES.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")


OWNERS = {"fused_experts_left_whole": "design-limit", "bloom_alibi_for_all_heads": "transformers"}
"""The owner a cause's source lines make it, where it is not AutoTP's bug (suites/mechanism.py `Owner`; the
unsupported-by-design ones, gpt2, openai_gpt and codegen, are "unsupported" in the reports, from
matrix/known_failures.toml)."""
STATEMENTS = {
    "bloom_alibi_for_all_heads": ("with an attention mask the sharded logits match", "ALiBi", "build_alibi_tensor"),
    "phi3_fused_qkv_sliced_by_config_heads": ("config.num_attention_heads * head_dim", "does not rescale"),
    "jetmoe_policy_probe_crash": ("no-policy assert", "kernel-injection policy"),
}
"""What the mechanism statement of a cause read wrong before must say (issue #56: the real mechanisms)."""


def test_every_failing_cell_is_labelled_once_with_evidence():
    mechanisms = tomllib.loads(LABELS.read_text())["mechanisms"]
    labelled = [cell for mechanism in mechanisms.values() for cell in mechanism["cells"]]
    assert len(labelled) == len(set(labelled)), "a cell labelled twice"
    assert set(labelled) == set(json.loads(FAILURES.read_text())), "the labels and the failing cells differ"
    for name, mechanism in mechanisms.items():
        assert mechanism["what"] and mechanism["evidence"], name
        assert all(":" in line.split(" ", 1)[0] for line in mechanism["evidence"]), f"{name}: file:function first"


def test_the_harness_causes_are_the_mechanisms():
    mechanism_of = {
        cell: name
        for name, mechanism in tomllib.loads(LABELS.read_text())["mechanisms"].items()
        for cell in mechanism["cells"]
    }
    cells_of_cause: dict[str, set[str]] = defaultdict(set)
    for cell, failure in json.loads(FAILURES.read_text()).items():
        autotp, broke_at = failure["autotp"], failure["broke_at"]
        cause = cause_of(
            Failure(
                failure["failure_class"],
                failure["signature"],
                read_record(AutoTPRecord, autotp) if autotp else None,
                read_record(BreakPoint, broke_at) if broke_at else None,
            )
        )
        assert cause.whose == OWNERS.get(mechanism_of[cell], "autotp"), (cell, cause)
        assert (cause.whose == "autotp") <= (mechanism_of[cell] not in OWNERS), (cell, cause)
        for words in STATEMENTS.get(mechanism_of[cell], ()):
            assert words in cause.words, (cell, cause.words)
        cells_of_cause[cause.key].add(cell)
    holding_two = {key: sorted({mechanism_of[c] for c in cells}) for key, cells in cells_of_cause.items()}
    assert {key: names for key, names in holding_two.items() if len(names) > 1} == {}, "a cause holds two mechanisms"
    causes_of_mechanism: dict[str, set[str]] = defaultdict(set)
    for key, cells in cells_of_cause.items():
        for cell in cells:
            causes_of_mechanism[mechanism_of[cell]].add(key)
    assert {name: keys for name, keys in causes_of_mechanism.items() if len(keys) > 1} == {}, (
        "a mechanism in two causes"
    )
    assert len(cells_of_cause) == len(causes_of_mechanism)
