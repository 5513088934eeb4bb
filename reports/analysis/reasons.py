"""A failure's cause in words a reader of DeepSpeed's docs or tracker uses: what went wrong under AutoTP, never the
error text (which the reports quote elsewhere in code spans).

A cause is a signature with its numbers masked: `<exception type>: <message> @ <file>:<function>` for what raised,
`<check>: <finding>` for what a check judged (the check one of suites/verdicts/check_names.py's). The words come from
the failure class, the check, and the library file that raised (DeepSpeed's parser, its fused-qkv split, a sharded
layer, the model's own forward)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from suites.verdicts.check_names import CHECK_NAMES, judged_signature

_RAISED = re.compile(r"^(?P<type>[A-Za-z_][\w.]*): ?(?P<message>.*?)(?: @ (?P<where>[^\s]+))?$", re.S)
_LABELLED = re.compile(
    r"^(?P<label>[a-z][a-z0-9_ ]*): (?P<raised>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt):.*)$", re.S
)
"""A raised failure, its type naming itself an exception, under the label of the stage it raised in: a check's name,
or a training stage's (`initialize`, `step 2`: suites/variants/training.py Progress)."""
_LEFT_WHOLE = re.compile("^" + re.escape(judged_signature("memory", "")) + r"(?P<kind>\w+) left whole")


@dataclass(frozen=True)
class Reason:
    """A cause in words: a short phrase for a title or a docs bullet, and the sentence that explains it."""

    short: str
    """`the MoE experts are not split` — what a title says after the model's name."""
    sentence: str
    """One sentence of what AutoTP did and what followed."""


def _raised(cause: str) -> tuple[str, str, str, str]:
    """(stage label, exception type, message, `file:function`) of a raised failure's cause; ("", "", cause, "") for a
    judged one. A training stage labels what raised in it (`initialize: ValueError: … @ deepspeed/…`, `load:
    RuntimeError: …`): the words are the exception's."""
    labelled = _LABELLED.match(cause.strip())
    label, text = (labelled["label"], labelled["raised"]) if labelled else ("", cause.strip())
    match = _RAISED.match(text)
    if not match or (not labelled and match["type"] in CHECK_NAMES):  # a judged failure: `<check>: <finding>`
        return "", "", cause, ""
    return label, match["type"], match["message"], match["where"] or ""


def reason(failure_class: str, cause: str) -> Reason:
    """The words for a failure class and cause (reports.analysis.signatures.mask_signature)."""
    label, kind, message, where = _raised(cause)
    if failure_class == "memory":
        left = _LEFT_WHOLE.match(cause)
        if left and left["kind"] == "experts":
            return Reason(
                "the MoE experts are not split",
                "AutoTP leaves the MoE experts whole on every rank (transformers stores them as fused 3-D tensors, "
                "which it does not shard): outputs are right, but no memory is saved on them.",
            )
        if left:
            return Reason(
                f"{left['kind']} are not split",
                f"AutoTP leaves some {left['kind']} whole on every rank: outputs are right, but no memory is saved "
                "on them.",
            )
        return Reason(
            "weights are split unevenly",
            "AutoTP gives one rank a larger share of some weights than their head or grain counts force.",
        )
    if failure_class == "numerics":
        return Reason(
            "logits differ from the unsharded model",
            "The sharded model runs, but its outputs differ from the unsharded model's beyond rounding: a weight, "
            "bias or per-head tensor is split or joined the wrong way.",
        )
    if failure_class == "generation":
        return Reason(
            "greedy generation differs",
            "The sharded model generates other tokens than the unsharded one (the decode path with the KV cache).",
        )
    if failure_class == "shard":
        # Only a training row labels its stages: its model is sharded by deepspeed.initialize, an inference cell's by
        # init_inference.
        return _shard_reason("deepspeed.initialize" if label else "init_inference", kind, message, where)
    if failure_class == "forward":
        return _forward_reason(kind, where)
    if failure_class == "timeout":
        return Reason("a collective hangs", "A rank waits forever in a collective (e.g. a rank holds an empty shard).")
    if failure_class == "crash":
        return Reason("a rank process dies", "A rank process dies (a signal or an exit in native code).")
    return Reason(f"{failure_class} failure", f"The cell fails ({failure_class}).")


def _shard_reason(call: str, kind: str, message: str, where: str) -> Reason:
    """`call`: what shards the model, `init_inference` or (a training row) `deepspeed.initialize`."""
    if "auto_tp.py" in where and "not supported" in message:
        return Reason(
            "AutoTP refuses the model (kernel injection has a policy for it)",
            f"{call} refuses AutoTP for this model because DeepSpeed has a kernel-injection policy for it.",
        )
    if "auto_tp.py" in where and "policy" in message:
        return Reason(
            "AutoTP finds no policy for the model",
            f"DeepSpeed's parser finds no layer it knows to all-reduce after, so {call} cannot shard it.",
        )
    if "fusedqkv" in where:
        return Reason(
            "the fused qkv split rejects its head counts",
            "AutoTP's split of the fused query/key/value weight refuses the model's head counts at this tp.",
        )
    if "containers/" in where:
        return Reason(
            "AutoTP applies another model's container to it",
            f"{call} picks a kernel-injection container of another architecture, which rejects the model.",
        )
    # The file that raised: two causes this rule alone names are told apart by their names (no error text in them:
    # the supported-models page quotes none).
    source = where.split(":", 1)[0].rsplit("/", 1)[-1]
    in_source = f" in {source}" if source else ""
    return Reason(
        f"{call} fails to shard it{in_source}",
        f"{call} raises {kind or 'an error'}{in_source} while sharding the model: no sharded model to run.",
    )


def _forward_reason(kind: str, where: str) -> Reason:
    if where.startswith("deepspeed/"):
        return Reason(
            "a sharded layer gets an input of the wrong width",
            "A layer AutoTP replaced receives a tensor of another width than its shard: a neighbouring split (or a "
            "missing one) changed it.",
        )
    if where.startswith("transformers/"):
        return Reason(
            "its forward fails on a tensor whose size the split changed",
            "The model's own forward meets a tensor whose size AutoTP's split changed (a per-rank head count or "
            "width it did not update, or a tensor left whole next to a split one); the unsharded model runs.",
        )
    return Reason(f"the sharded model raises {kind or 'an error'}", "The sharded model raises in its forward pass.")
