"""The minimal script of a draft issue: at most MAX_LINES lines a DeepSpeed maintainer reads at a glance and runs
with `deepspeed --num_gpus <tp> <file>` (on a CPU-only machine too: DeepSpeed's CPU accelerator with gloo).

Generated for the cause from the cell's record: imports, the cell's tiny config as a literal, `from_config` under a
seed, `init_inference`, the cell's first two forwards in its order (a padded batch of two prompts with its attention
mask, then one prompt without a mask: suites/checks/probes.py `observe`), and one assertion that fails with the cause's
symptom (`Symptom`): the exception init_inference or a forward raises (the cell's own line, the same shapes: a crash in
either forward is met with the cell's inputs' shapes), the sharded logits' distance from the unsharded model's, or the
weights a rank holds whole or unevenly. No name of the harness appears in it; the full standalone script (every probe,
the same checkpoint) is attached to the draft beside it."""

from __future__ import annotations

import functools
import re
import textwrap
from dataclasses import dataclass
from typing import Literal

from matrix.cells import Cell
from matrix.redaction import redact
from reports.outputs.render_cache import remembered
from reports.store import CellResult
from suites.records.run_records import launcher_command

MAX_LINES = 40
WIDTH = 116
SEED = 0
SymptomKind = Literal["raises", "logits", "generation", "whole", "uneven"]
_GROUP = re.compile(r"([\w.*]+?)\.?\{([^}]*)\}|([\w.*]+)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _probe_prompt_shape() -> tuple[int, int]:
    # lazily: suites/checks/inputs.py imports torch, which `python -m reports merge` must not (merge's memory)
    from suites.checks.inputs import ProbeSpec

    spec = ProbeSpec()
    return spec.prompt_tokens, spec.left_pad


@functools.cache
def prompt_shape() -> tuple[int, int]:
    """The probes' prompt length and the left padding of the batch's second prompt (suites/checks/inputs.py
    ProbeSpec), from the render cache where the same source was read before: its module imports torch (seconds)."""
    tokens, left_pad = remembered("probe-prompt-shape", _probe_prompt_shape)
    return int(tokens), int(left_pad)


@dataclass(frozen=True)
class Symptom:
    """What the minimal script's last line shows, from the failure's class and signature."""

    kind: SymptomKind
    stage: str = ""
    """For `raises`: `shard` (init_inference raises) or `forward`."""
    raised: str = ""
    """For `raises`: the exception as the cell saw it (its last line), said in a comment of the script."""
    tensors: tuple[str, ...] = ()
    """For `whole` and `uneven`: layer 0's parameters the memory finding names."""
    logits_rel: float = 0.0
    """For `logits`: the tolerance, relative to the unsharded model's largest logit."""


@dataclass(frozen=True)
class MinimalScript:
    name: str
    """Its file name: `autotp-<model type>-tp<N>.py`."""
    text: str


def symptom_of(result: CellResult, logits_rel: float) -> Symptom:
    """The symptom a failed cell's record shows (its class; its memory finding's tensors)."""
    if result.failure_class in ("shard", "forward"):
        return Symptom("raises", stage=result.failure_class, raised=last_error_line(result.message))
    if result.failure_class == "generation":
        return Symptom("generation")
    if result.failure_class == "memory":
        finding = result.signature.removeprefix("memory: ")
        kind, _, groups = finding.partition(": ")
        tensors = layer_zero_tensors(groups)
        return Symptom("uneven" if "unevenly" in kind else "whole", tensors=tensors)
    return Symptom("logits", logits_rel=logits_rel)


def last_error_line(message: str) -> str:
    """The exception line of a traceback (`RuntimeError: …`), one line without control characters."""
    lines = [line.strip() for line in message.splitlines() if line.strip() and not line.startswith(("logs:", " "))]
    found = next((line for line in reversed(lines) if re.match(r"[A-Za-z_][\w.]*(Error|Exception)\b", line)), "")
    return _CONTROL.sub(" ", found)[:300]


def layer_zero_tensors(groups: str) -> tuple[str, ...]:
    """`model.layers.*.self_attn.{q_proj,o_proj}` → layer 0's `….q_proj`, `….o_proj` (suites/checks/memory.py
    `layer_groups` writes them so)."""
    names: list[str] = []
    for match in _GROUP.finditer(groups):
        head, leaves, single = match.groups()
        parts = [f"{head}.{leaf.strip()}" for leaf in leaves.split(",")] if leaves is not None else [single]
        names += [part.replace(".*.", ".0.") for part in parts if part]
    return tuple(dict.fromkeys(names))


def _config_lines(model_type: str, tiny: dict[str, object]) -> list[str]:
    items = ", ".join(f"{key}={value!r}" for key, value in tiny.items())
    wrapped = textwrap.wrap(items, WIDTH - 4, break_long_words=False, break_on_hyphens=False)
    return [f"config = AutoConfig.for_model({model_type!r},", *(f"    {line}" for line in wrapped), ")"]


def _symptom_lines(symptom: Symptom, tp: int, heads: int) -> list[str]:
    if symptom.kind == "raises":
        where = "init_inference" if symptom.stage == "shard" else "the sharded forward"
        return [f"# {where} above raises: {symptom.raised}", 'print("no error: not reproduced")']
    if symptom.kind == "logits":
        return [
            "diff, bound = (logits - expected).abs().max().item(), "
            f"{symptom.logits_rel!r} * expected.abs().max().item()",
            "assert diff <= bound, f\"rank {rank}: sharded logits differ from the unsharded model's by {diff:.3g} "
            '(bound {bound:.3g})"',
        ]
    if symptom.kind == "generation":
        return [
            "tokens = engine.module.generate(input_ids.to(device), max_new_tokens=8, do_sample=False).cpu()",
            'assert torch.equal(tokens, expected_tokens), f"rank {rank}: {tokens.tolist()} != '
            '{expected_tokens.tolist()}"',
        ]
    names = f"NAMES = {list(symptom.tensors)!r}"
    held = (
        "held = {n.removesuffix('.weight'): p.numel() for n, p in engine.module.named_parameters() "
        "if n.removesuffix('.weight') in NAMES}"
    )
    if symptom.kind == "whole":
        return [
            names,
            held,
            "whole = [n for n, size in held.items() if size == full[n]]",
            f'assert not whole, f"rank {{rank}} holds all of {{whole}}: not split over {tp} ranks"',
        ]
    return [
        names,
        held,
        f"shares = [dict[str, int]() for _ in range({tp})]",
        "torch.distributed.all_gather_object(shares, held)",
        "for n in held:  # an even split gives every rank its heads' share, within one head",
        "    sizes = [share[n] for share in shares]",
        f'    assert max(sizes) - min(sizes) <= full[n] // {heads}, f"{{n}} split unevenly over the ranks: {{sizes}}"',
    ]


def minimal_script(cell: Cell, result: CellResult, title: str) -> MinimalScript:
    """The script for a failed cell, at most MAX_LINES lines (ValueError if a config makes it longer)."""
    symptom = symptom_of(result, cell.model.tolerance_for(cell.dtype).logits_rel)
    name = f"autotp-{cell.model.model_type}-tp{cell.tp}.py"
    dtype = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[cell.dtype]
    heads = result.autotp.heads if result.autotp and result.autotp.heads else 1
    needs_reference = symptom.kind in ("logits", "generation")
    tokens, left_pad = prompt_shape()
    lines = [
        f"# {_CONTROL.sub(' ', title)}",
        f"# Run: {launcher_command(cell.tp, name)}  (a CPU-only machine works: DeepSpeed's CPU accelerator)",
        "import os",
        "",
        "import torch",
        "",
        "if not torch.cuda.is_available():",
        '    os.environ.setdefault("DS_ACCELERATOR", "cpu")',
        "import deepspeed  # noqa: E402",
        "from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402",
        "",
        "deepspeed.init_distributed()",
        "rank = torch.distributed.get_rank()",
        f"torch.manual_seed({SEED})",
        *_config_lines(cell.model.model_type, cell.model.tiny),
        f"model = AutoModelForCausalLM.from_config(config, dtype=torch.{dtype}).eval()",
        f"batch = torch.randint(3, config.vocab_size, (2, {tokens}))",
        "mask = torch.ones_like(batch)",
        f"mask[1, :{left_pad}] = 0  # the second prompt is left-padded",
        "input_ids = batch[:1]",
        *(["with torch.no_grad():"] if needs_reference else []),
        *(["    expected = model(input_ids).logits"] if symptom.kind == "logits" else []),
        *(
            ["    expected_tokens = model.generate(input_ids, max_new_tokens=8, do_sample=False)"]
            if symptom.kind == "generation"
            else []
        ),
        *(
            ["full = {n.removesuffix('.weight'): p.numel() for n, p in model.named_parameters()}"]
            if symptom.kind in ("whole", "uneven")
            else []
        ),
        "engine = deepspeed.init_inference(",
        f'    model, tensor_parallel={{"tp_size": {cell.tp}}}, dtype=torch.{dtype}, replace_with_kernel_inject=False',
        ")",
        "device = deepspeed.get_accelerator().current_device_name()",
        "with torch.no_grad():",
        "    engine.module(batch.to(device), attention_mask=mask.to(device))",
        "    logits = engine.module(input_ids.to(device)).logits.cpu()  # one prompt, no mask",
        *_symptom_lines(symptom, cell.tp, heads),
    ]
    if len(lines) > MAX_LINES:
        raise ValueError(f"{name}: the minimal script has {len(lines)} lines, more than {MAX_LINES}")
    return MinimalScript(name, redact("\n".join(lines) + "\n"))
