"""The harness's causes agree with a labelling of every failing cell of the default matrix by mechanism, made by
reading DeepSpeed's and transformers' code at each failing line (data/default_matrix_mechanisms.toml, with the
file:function evidence per mechanism): no cause holds two mechanisms, no mechanism is two causes.

The harness's side is what the ranks recorded for those cells in a real `nox -s matrix` run (DeepSpeed 0.19.8,
transformers 5.25.0): each failing cell's class, signature, AutoTP record and break point
(data/default_matrix_failures.json), given to suites/verdicts/mechanism.py `cause_of` here. After a change to what the
ranks
record, run the default matrix and refresh the file from its results:

    python -c "from tests.suites.test_default_matrix_causes import write_failures; write_failures('results')"
"""

import json
import re
from collections import defaultdict
from pathlib import Path

import tomllib

from matrix.json_records import read_record
from matrix.remedies import RemedyResult, TakenAt
from suites.records.run_records import read_records
from suites.verdicts.cause import Cause
from suites.verdicts.mechanism import AutoTPRecord, BreakPoint, Failure, cause_of, cause_sentence
from suites.verdicts.statements import proof_of, stated

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


OWNERS = {
    "fused_experts_left_whole": "design-limit",
    "kv_unit_split_idle_ranks": "design-limit",
    "bloom_alibi_for_all_heads": "transformers",
}
"""The owner a cause's source lines make it, where it is not AutoTP's bug (suites/verdicts/mechanism.py `Owner`; the
unsupported-by-design ones, gpt2, openai_gpt and codegen, are "unsupported" in the reports, from
matrix/known_failures.toml)."""
STATEMENTS = {
    "bloom_alibi_for_all_heads": ("with an attention mask the sharded logits match", "ALiBi", "build_alibi_tensor"),
    "phi3_fused_qkv_sliced_by_config_heads": ("config.num_attention_heads * head_dim", "does not rescale"),
    "jetmoe_policy_probe_crash": ("no-policy assert", "kernel-injection policy"),
    "ctrl_attention_dense_missed_by_parser": (
        "the parser made `multi_head_attention.dense` column-parallel; it writes the residual",
        "registered just before each LayerNorm",
        "for EncoderLayer it all-reduces `ffn.2`",
    ),
    "qwen3_next_linear_attention_heads_not_divided": ("`in_proj_qkvz`", "`in_proj_ba`", "full `num_k_heads`"),
    "diffllama_head_pairing": ("pairs head i with head i + heads/2", "contiguous run of heads"),
    "persimmon_fused_qkv_glm_layout": ("catch-all key `DecoderLayer`", "interleaved per head"),
    "hunyuan_matched_as_yuan": ("takes HunYuanDenseV1DecoderLayer for Yuan2", "'Yuan' in str(module)"),
    "norm_over_split_width_left_whole": ("would not fix it", "a reduction across ranks"),
    "minimax_lightning_attention_state_left_whole": ("would not fix it",),
    "mamba_mixer_state_left_whole": ("packed projections are split as plain", "`mup_vector`", "`x_proj` packs"),
}
"""What the mechanism statement of a cause read wrong or only located before must say (issue #56: the real
mechanisms), of every cell of the cause."""
UNSUPPORTED = {"gpt2_unsupported_by_design", "openai_gpt_no_policy", "codegen_kv_heads_requirement"}
"""Refusals DeepSpeed documents: their owner and evidence come from matrix/known_failures.toml in the reports."""
COUNT_CLAIM = re.compile(r"\d+ kv heads?|tp \d+|ranks? \d+(?:\.\.\d+)?")
"""A count a sentence claims of a cell: kv heads, tp, which ranks."""


def _causes() -> dict[str, list[tuple[str, Cause]]]:
    """Each cause key of the default matrix's failing cells, with its cells and their causes."""
    causes: dict[str, list[tuple[str, Cause]]] = defaultdict(list)
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
        causes[cause.mechanism_key].append((cell, cause))
    return causes


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
        cells_of_cause[cause.mechanism_key].add(cell)
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


def test_each_cause_states_its_mechanism_read_at_the_failing_lines_for_every_cell():
    """The sentence a cause shows (over all its cells) says what was read at its failing lines (STATEMENTS), and
    every cell of it does too."""
    mechanism_of = {
        cell: name
        for name, mechanism in tomllib.loads(LABELS.read_text())["mechanisms"].items()
        for cell in mechanism["cells"]
    }
    for key, members in _causes().items():
        sentence = cause_sentence(key, [cause.words for _, cause in members])
        for cell, cause in members:
            for words in STATEMENTS.get(mechanism_of[cell], ()):
                assert words in sentence, (key, sentence)
                assert words in cause.words, (cell, cause.words)


def test_a_cause_sentence_claims_no_count_a_cell_of_it_contradicts():
    """Shown for every cell of its cause (on each checkpoint's page too), a sentence claims a kv-head count, a tp or
    ranks only where every cell's own words claim the same: glm at tp 3 (2 kv heads) never reads "1 kv head < tp 2",
    whichever cells the cause holds."""
    for key, members in _causes().items():
        for subset in (members, *([member] for member in members), members[::2], members[1::2]):
            if not subset:
                continue
            sentence = cause_sentence(key, [cause.words for _, cause in subset])
            for claim in COUNT_CLAIM.findall(sentence):
                assert all(claim in cause.words for _, cause in subset), (key, claim, [cell for cell, _ in subset])
    idle = _causes()["kv-unit split|ranks idle"]
    glm = [cause.words for cell, cause in idle if cell == "glm.faithful-tp3"]
    gemma = [cause.words for cell, cause in idle if cell.startswith("gemma.")]
    assert "2 kv heads < tp 3, so rank 2 holds no query head" in cause_sentence(idle[0][1].mechanism_key, glm)
    shared = cause_sentence(idle[0][1].mechanism_key, glm + gemma)
    assert "1 kv head" not in shared and "ranks past the kv-head count hold no query head" in shared
    assert "FalconAttention" not in shared, "a model's crash named for a cause that does not hold it"


def test_the_kv_unit_split_crashes_where_the_model_hard_codes_it_and_idles_by_design_elsewhere():
    """falcon-7b and santacoder crash on the starved ranks (AutoTP's bug: DeepSpeed documents their result as
    correct); separate projections only idle them, the limit DeepSpeed documents."""
    crashed = _causes()["kv-unit split|query heads starved"]
    sentence = cause_sentence(crashed[0][1].mechanism_key, [cause.words for _, cause in crashed])
    for attention in ("FalconAttention", "GPTBigCodeAttention"):
        assert f"`{attention}.forward` hard-codes its kv split" in sentence
    assert {cell.split(".")[0] for cell, _ in crashed} == {"falcon", "gpt_bigcode"}
    assert all("hard-codes" in cause.words and cause.whose == "autotp" for _, cause in crashed)
    idle = _causes()["kv-unit split|ranks idle"]
    assert all(
        "hard-codes" not in c.words and c.whose == "design-limit" and "Limitations 1" in c.evidence for _, c in idle
    )


def test_every_cause_carries_its_owner_and_evidence_line():
    """Issue #56 item 4: every cause's owner comes with the source line that makes it that owner's; only the refusals
    DeepSpeed documents take theirs from matrix/known_failures.toml."""
    mechanism_of = {
        cell: name
        for name, mechanism in tomllib.loads(LABELS.read_text())["mechanisms"].items()
        for cell in mechanism["cells"]
    }
    for key, members in _causes().items():
        for cell, cause in members:
            if mechanism_of[cell] not in UNSUPPORTED:
                assert cause.evidence, (cell, key)


def test_a_mechanism_is_not_proven_until_a_remedy_is_verified():
    """Until a remedy turned every cell of a cause green, its sentence says so and what was tried; a verified remedy's
    own sentence replaces it whole."""
    ctrl = proof_of("column-parallel|multi_head_attention.dense")
    assert "injection_policy" in ctrl.tried
    assert stated("X", ctrl) == f"X (mechanism not proven: {ctrl.tried})"
    assert "no remedy run yet" in proof_of("left whole|norm").tried
    assert "attention mask" in proof_of("model|BloomAttention").tried

    taken = TakenAt("0.19.8", "", "5.25.0", "45708c6", "2026-12-07T09:30:48Z")

    def ran(status, fixed, cells=("ctrl.faithful-eager-fp32-tp2", "ctrl.faithful-eager-fp32-tp3")):
        return RemedyResult(
            remedy="ctrl-policy", kind="workaround", cause_models=("ctrl.faithful",),
            summary="pass injection_policy={EncoderLayer: ('dense',)}.", mechanism="the parser missed it.", how="",
            status=status, cause_cells=cells, fixed=fixed, changed=(), others_compared=9, seconds=1.0, taken_at=taken,
        )  # fmt: skip

    cells = ("ctrl.faithful-eager-fp32-tp2", "ctrl.faithful-eager-fp32-tp3")
    verified = ran("verified", cells)
    proof = proof_of("column-parallel|multi_head_attention.dense", cells, [verified], "0.19.8")
    change = "this workaround: Pass injection_policy={EncoderLayer: ('dense',)}"  # the change in words, never the slug
    at = "at DeepSpeed 0.19.8, transformers 5.25.0"
    assert stated("X", proof) == f"the parser missed it (verified: 2 of 2 cells pass with {change}; {at})"
    assert proof.by == (verified,) and proof.verified == "the parser missed it."
    # a proof taken at another DeepSpeed than its cells fail at still counts, and says so
    later = proof_of("column-parallel|multi_head_attention.dense", cells, [verified], "0.20.0")
    assert stated("X", later).endswith(f"{at}, not the DeepSpeed 0.20.0 these cells fail at)")
    # a cause with a cell the remedy did not fix, or a remedy that is not verified: not proven, and what was tried
    tried = "workaround (Pass injection_policy={EncoderLayer: ('dense',)})"
    wider = proof_of("column-parallel|x", (*cells, "bloom.faithful-eager-fp32-tp2"), [verified])
    assert stated("X", wider) == f"X (mechanism not proven: {tried}: 2 of 3 cells pass)"
    half = proof_of("column-parallel|x", cells, [ran("unverified", cells[:1])])
    assert stated("X", half) == f"X (mechanism not proven: {tried}: 1 of 2 cells pass)"
    # a remedy of other cells says nothing of this cause
    other = proof_of("column-parallel|multi_head_attention.dense", ("llama-eager-fp32-tp2",), [verified])
    assert stated("X", other) == f"X (mechanism not proven: {ctrl.tried})"


def test_a_training_cells_memory_finding_is_the_cause_an_inference_cell_has():
    """A training cell records no AutoTPRecord (it shards through the training engine); its memory finding is still
    the memory cause, with its owner and evidence (experts left whole: a documented design limit), so it is one cause
    with the inference cells' and its sentence goes through `stated` like theirs, never keyed by its text alone."""
    finding = "memory: experts left whole: model.layers.*.mlp.experts.{gate_up_proj,down_proj}"
    record = AutoTPRecord(tp=2, heads=4, kv_heads=2, head_dim=8, experts=4, policies=(), unparsed=(), replaced=(),
                          left_whole=())  # fmt: skip
    trained, inferred = cause_of(Failure("memory", finding)), cause_of(Failure("memory", finding, record))
    assert trained == inferred
    assert (trained.mechanism_key, trained.whose) == (
        "memory|experts left whole: experts.{gate_up_proj,down_proj}",
        "design-limit",
    )
    assert trained.words == finding.removeprefix("memory: ") and "AutoTP does not shard" in trained.evidence
