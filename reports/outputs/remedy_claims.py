"""What a draft issue claims of a cause's remedies: only a remedy `nox -s remedy` verified on every cell of the cause
(reports.analysis.failing_now `FailingCause.proven_by`) is claimed, as "Workaround (verified: N of N cells pass)" with
the exact `init_inference` call that passes it, or "Proposed fix (verified: N of N cells pass)" with the diff inline;
a cause without one claims nothing (its sentence says "mechanism not proven"). Written for a DeepSpeed maintainer: no
harness names, no paths of this machine."""

from __future__ import annotations

from matrix import PROJECT_ROOT
from matrix.cell_arguments import CellArguments
from matrix.remedies import REMEDIES_FILE, RemedyResult, change_words, load_remedies
from reports.outputs.markdown_safety import fence

TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def remedy_sections(results: tuple[RemedyResult, ...], tp: int, dtype: str) -> str:
    """The sections of the verified remedies of a cause ("" when none), a workaround's call written for the example
    cell's `tp` and `dtype`."""
    verified = [result for result in results if result.status == "verified"]
    stacked = any(result.requires for result in verified)
    summaries = (
        {remedy.name: change_words(remedy.summary) for remedy in load_remedies(REMEDIES_FILE, PROJECT_ROOT)}
        if stacked
        else {}
    )
    return "".join(remedy_section(result, tp, dtype, summaries) for result in verified)


def remedy_section(result: RemedyResult, tp: int, dtype: str, summaries: dict[str, str]) -> str:
    """ "Workaround (verified: N of N cells pass)" with the call that passes it, or "Proposed fix (verified …)"
    with the diff, each with the mechanism it proves and what else it was run on; the patches it was tested on top of
    by what they change (`summaries`: remedy name -> its change_words)."""
    others = f"With it, every one of the {len(result.cause_cells)} failing configurations passes" + (
        f", and none of the {result.others_compared} other configurations run with and without it changed its result."
        if result.others_compared
        else "."
    )
    lines = ["", f"**{result.claim()}**", "", result.mechanism, "", f"{result.change}. {others}", ""]
    if result.kind == "workaround":
        lines += fence("\n".join(workaround_call(result.arguments, tp, dtype)), "python")
    else:
        lines += fence(result.how.rstrip("\n"), "diff")
    if required := [summaries.get(name, name) for name in result.requires]:
        lines += ["", "Tested on top of, applied first:", "", *(f"- {summary}" for summary in required)]
    return "\n".join(lines) + "\n"


def workaround_call(arguments: CellArguments, tp: int, dtype: str) -> list[str]:
    """The lines a user writes to pass a workaround: the model keywords at load, the `init_inference` call with its
    `injection_policy` (each block class found among the model's modules by its name), the forward's mask."""
    lines = []
    if arguments.model_kwargs:
        kwargs = ", ".join(f"{key}={value!r}" for key, value in arguments.model_kwargs)
        lines += [f"model = AutoModelForCausalLM.from_pretrained(checkpoint, {kwargs})"]
    if arguments.injection_policy:
        lines += ["blocks = {type(module).__name__: type(module) for module in model.modules()}"]
    lines += [
        "engine = deepspeed.init_inference(",
        "    model,",
        f'    tensor_parallel={{"tp_size": {tp}}},',
        f"    dtype=torch.{TORCH_DTYPES.get(dtype, 'float32')},",
        "    replace_with_kernel_inject=False,",
    ]
    if arguments.injection_policy:
        policy = ", ".join(f"blocks[{block!r}]: {tuple(names)!r}" for block, names in arguments.injection_policy)
        lines += [f"    injection_policy={{{policy}}},"]
    lines += [")"]
    if arguments.forward_mask:
        lines += ["logits = engine.module(input_ids, attention_mask=torch.ones_like(input_ids)).logits"]
    return lines
