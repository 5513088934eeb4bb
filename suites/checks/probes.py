"""What a cell observes of a model: the same probes run on the unsharded reference and on the
sharded model, so the checks compare like with like.

Each probe exercises one code path a user hits (a bug can live in one path only):
prefill with and without an attention mask, greedy decoding with the KV cache, and the `labels=`
loss path used for perplexity.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

import torch

from matrix.registry import ModelEntry, RegistryError
from matrix.shapes import MATRIX_TP, base_shape, faithful_groups_or_why, load_real_shapes, read_shape, split_shaped_name
from suites.checks.breakpoints import module_outputs
from suites.checks.inputs import ProbeInputs, ProbeSpec
from suites.verdicts.check_names import judged_signature
from suites.verdicts.outcome import LibraryOutputError

if TYPE_CHECKING:
    from suites.base.model_types import CausalLM, Device

MAX_EXP_ARGUMENT = 709.0
"""math.exp overflows above this."""


def _logits(output: object, what: str, expected_dims: int) -> torch.Tensor:
    """A model output's logits as they enter the harness: present, a tensor, of the expected rank."""
    logits = getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor) or logits.dim() != expected_dims:
        found = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise LibraryOutputError(
            "numerics", judged_signature("shapes", f"{what} returned no {expected_dims}-D logits"), f"got {found}"
        )
    return logits


@dataclass
class Observations:
    logits_masked: torch.Tensor
    """[real tokens, V] float32 prefill logits of the padded batch at its unpadded positions
    (padded positions hold arbitrary values in any model)."""
    logits_plain: torch.Tensor
    """[1, T, V] float32 prefill logits of the first prompt with no attention mask passed."""
    gen_tokens: torch.Tensor
    """[K] greedy tokens generated after the first prompt."""
    gen_logits: torch.Tensor
    """[K, V] float32 logits of each decoding step."""
    gen_padded_tokens: torch.Tensor
    """[2, K] greedy tokens generated for the padded batch at once (row 1 is left-padded): batched decoding."""
    gen_padded_logits: torch.Tensor
    """[2, K, V] float32 logits of each of its decoding steps."""
    nll_sum: float
    """Summed negative log-likelihood over the scored corpus tokens."""
    nll_tokens: int
    forward_seconds: float
    footprint: Footprint | None
    """The unsharded model's tensors (`footprint`), what the memory checks compare the ranks' bytes with;
    None on the sharded model, whose module types AutoTP replaced (each rank hands its own bytes by name
    to rank 0 instead: suites/checks/contracts.py RankSummary)."""
    routing_masked: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.int64))
    """[real tokens, routers x k] the experts each MoE router chose for each token of `logits_masked`, sorted
    per router ([tokens, 0] for a model without routers found): the logits check tells a routing choice that
    flipped on a near-tie from a drift (see `expert_choices`)."""
    routing_plain: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.int64))
    """[T, routers x k] the same for the tokens of `logits_plain`."""
    module_outputs: dict[str, tuple[tuple[int, ...], torch.Tensor]] = field(default_factory=dict)
    """Each module's output in the plain forward, summarised (suites/checks/breakpoints.py `module_outputs`), in the
    order the modules finished: where a cell's numbers diverge is found by comparing the two sides'."""

    def unsharded_footprint(self) -> Footprint:
        """The footprint of the reference's observations: asking the sharded model's is a harness bug."""
        if self.footprint is None:
            raise ValueError("the memory checks asked the sharded model's observations for a footprint (a harness bug)")
        return self.footprint

    @property
    def perplexity(self) -> float:
        if not self.nll_tokens:  # the probe did not run (ProbeSpec.perplexity_skipped)
            return math.nan
        mean = self.nll_sum / self.nll_tokens
        return math.inf if mean > MAX_EXP_ARGUMENT else math.exp(mean)  # a huge finite loss is a verdict, not an error


def _sliding_window_nll(
    model: CausalLM, corpus_ids: torch.Tensor, spec: ProbeSpec, device: Device
) -> tuple[float, int]:
    """Perplexity the HF-guide way: overlapping windows, only the new tokens of each window scored. One forward per
    window, not the windows as one batch: the `labels=` loss comes back as one float32 mean, and one rounding of a
    batch's mean put the default matrix's fp32 perplexity noise at half its bound (each window's own rounding, summed
    in float64, keeps it at a fifth; docs/findings.md, 2026-12-04)."""
    nll_sum, scored, previous_end = 0.0, 0, 0
    length = corpus_ids.shape[1]
    for begin in range(0, length, spec.ppl_stride):
        end = min(begin + spec.ppl_window, length)
        new_tokens = end - previous_end
        window = corpus_ids[:, begin:end].to(device)
        labels = window.clone()
        labels[:, :-new_tokens] = -100
        loss = model(window, labels=labels).loss
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise LibraryOutputError(
                "numerics",
                judged_signature("perplexity", "the labels= forward returned no scalar loss"),
                f"got {type(loss).__name__}",
            )
        # The loss is a mean over the shifted labels: the first token of a window is never predicted.
        predicted = int((labels[:, 1:] != -100).sum().item())
        nll_sum += loss.float().item() * predicted
        scored += predicted
        previous_end = end
        if end == length:
            break
    return nll_sum, scored


@torch.no_grad()
def observe(
    model: CausalLM,
    inputs: ProbeInputs,
    spec: ProbeSpec,
    device: Device,
    unsharded: bool = True,
    mask_plain: bool = False,
) -> Observations:
    """The probes' outputs; with `unsharded` (the reference) also the model's `footprint`, which no check reads
    of the sharded model; `mask_plain`: the mask-less forward is given an all-ones mask (a remedy's argument,
    matrix/cell_arguments.py)."""
    started = time.perf_counter()
    batch_ids, batch_mask = inputs.batch_ids.to(device), inputs.batch_mask.to(device)
    with expert_choices(model) as choices_masked:
        masked = _logits(model(batch_ids, attention_mask=batch_mask), "the padded-batch forward", 3)
    if masked.shape[:2] != batch_ids.shape:
        raise LibraryOutputError(
            "numerics",
            judged_signature("shapes", "the padded-batch forward returned logits for other positions"),
            f"{tuple(masked.shape)} for input ids {tuple(batch_ids.shape)}",
        )
    real = batch_mask.bool().cpu()
    logits_masked = masked[batch_mask.bool()].float().cpu()
    with expert_choices(model) as choices_plain, module_outputs(model) as outputs:
        plain_mask = {"attention_mask": torch.ones_like(batch_ids[:1])} if mask_plain else {}
        logits_plain = _logits(model(batch_ids[:1], **plain_mask), "the forward without attention mask", 3)
        logits_plain = logits_plain.float().cpu()
    gen_tokens, gen_logits = _greedy(model, batch_ids[:1], batch_mask[:1], spec)
    gen_padded_tokens, gen_padded_logits = _greedy(model, batch_ids, batch_mask, spec)
    nll_sum, nll_tokens = (
        (0.0, 0) if spec.perplexity_skipped else _sliding_window_nll(model, inputs.corpus_ids, spec, device)
    )
    forward_seconds = time.perf_counter() - started
    return Observations(
        logits_masked=logits_masked,
        logits_plain=logits_plain,
        gen_tokens=gen_tokens[0],
        gen_logits=gen_logits[0],
        gen_padded_tokens=gen_padded_tokens,
        gen_padded_logits=gen_padded_logits,
        nll_sum=nll_sum,
        nll_tokens=nll_tokens,
        forward_seconds=forward_seconds,
        footprint=footprint(model) if unsharded else None,
        routing_masked=_per_token(choices_masked, batch_ids.shape)[real],
        routing_plain=_per_token(choices_plain, (1, batch_ids.shape[1]))[0],
        module_outputs=outputs,
    )


ROUTER_NAMES = ("gate", "router")
"""What MoE blocks call their router (a sibling of their `experts`): transformers' TopKRouter classes and
the plain linear gates of older releases alike."""


def _routers(model: CausalLM) -> list[tuple[torch.nn.Module, int]]:
    """(router, experts it picks per token) of every MoE block: a module named as in ROUTER_NAMES whose parent
    holds `experts`. AutoTP keeps routers whole, so the sharded model has the same ones."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    routers = []
    for parent in model.modules():
        if not isinstance(getattr(parent, "experts", None), torch.nn.Module):
            continue
        for name in ROUTER_NAMES:
            router = getattr(parent, name, None)
            top_k = getattr(router, "top_k", None) or getattr(config, "num_experts_per_tok", None)
            if isinstance(router, torch.nn.Module) and isinstance(top_k, int) and top_k > 0:
                routers.append((router, top_k))
    return routers


def _chosen(output: object, top_k: int) -> torch.Tensor | None:
    """[tokens, k] the experts a router's output chose, sorted: its integer index tensor (TopKRouter classes
    return one), else the top k of its logits (a plain linear gate); None when it returns neither."""
    if isinstance(output, torch.Tensor):
        tensors = [output]
    else:
        tensors = [t for t in output if isinstance(t, torch.Tensor)] if isinstance(output, (tuple, list)) else []
    indices = [t for t in tensors if not t.is_floating_point() and t.shape[-1:] == (top_k,)]
    if indices:
        chosen = indices[-1]
    else:
        logits = [t for t in tensors if t.is_floating_point() and t.shape[-1] >= top_k]
        if not logits:
            return None
        chosen = logits[0].topk(top_k, dim=-1).indices
    return chosen.reshape(-1, top_k).sort(dim=-1).values.cpu()


@contextmanager
def expert_choices(model: CausalLM) -> Iterator[list[list[torch.Tensor]]]:
    """Records, for one forward inside the block, the experts every router chose per token: a list per router
    of the [tokens, k] choices of each of its calls."""
    recorded: list[list[torch.Tensor]] = []
    handles = []
    for router, top_k in _routers(model):
        calls: list[torch.Tensor] = []
        recorded.append(calls)

        def keep(
            _module: torch.nn.Module,
            _inputs: tuple[object, ...],
            output: object,
            calls: list[torch.Tensor] = calls,
            top_k: int = top_k,
        ) -> None:
            chosen = _chosen(output, top_k)
            if chosen is not None:
                calls.append(chosen)

        handles.append(router.register_forward_hook(keep))
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()


def _per_token(recorded: list[list[torch.Tensor]], batch_shape: tuple[int, ...]) -> torch.Tensor:
    """[B, T, routers x k] from one forward's recorded choices; [B, T, 0] when no router answered once with one
    row per token (a model without routers, or one whose router saw another token layout)."""
    tokens = math.prod(batch_shape)
    columns = [calls[0] for calls in recorded if len(calls) == 1 and calls[0].shape[0] == tokens]
    if not columns or len(columns) != len(recorded):
        return torch.zeros(*batch_shape, 0, dtype=torch.int64)
    return torch.cat(columns, dim=1).to(torch.int64).reshape(*batch_shape, -1)


def _greedy(
    model: CausalLM, ids: torch.Tensor, mask: torch.Tensor, spec: ProbeSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, K] greedy tokens, [B, K, V] logits of each decode step) with the KV cache."""
    generated = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=spec.new_tokens,
        min_new_tokens=spec.new_tokens,
        do_sample=False,
        use_cache=True,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    steps = [tuple(step.shape) for step in generated.logits]
    if len(set(steps)) != 1 or len(steps) != spec.new_tokens or len(steps[0]) != 2:
        raise LibraryOutputError(
            "numerics",
            judged_signature("shapes", "generate returned decode-step logits of differing shapes"),
            f"{steps} for {spec.new_tokens} new tokens",
        )
    return generated.sequences[:, ids.shape[1] :].cpu(), torch.stack(generated.logits, dim=1).float().cpu()


TensorKind = Literal["linears", "experts", "convs", "embeddings", "rest"]
KINDS: tuple[TensorKind, ...] = get_args(TensorKind)
"""What a rank holds, by kind: attention/MLP linear layers and MoE experts are what AutoTP must split;
convolution kernels (vision patch embeddings, audio front ends, mamba), embeddings + lm_head and the rest
(norms, routers' buffers, rotary tables) may stay whole."""
SPLIT_KINDS: tuple[TensorKind, ...] = ("linears", "experts")
CONV_MODULES = (
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
    torch.nn.ConvTranspose1d,
    torch.nn.ConvTranspose2d,
    torch.nn.ConvTranspose3d,
)


PAIRED_HEADS = ("diffllama",)
"""Differential attention: query head i works with head i + heads/2 and kv head j with j + kv_heads/2
(transformers' `DiffLlamaAttention.forward` chunks the values and the attention output in two halves along the head
axis), so the smallest piece a rank can hold is a kv-head pair with its query heads."""


@dataclass(frozen=True)
class SplitCounts:
    """How finely AutoTP can split the model's weights, from its (text) config; 0 where the config has none."""

    heads: int
    kv_heads: int
    """Key/value heads: AutoTP gives each rank whole kv heads, so fewer kv heads than ranks cannot all split."""
    head_dim: int
    experts: int
    """Routed experts of a MoE layer: the router's output features (AutoTP keeps routers whole)."""
    head_pairs: bool = False
    """Differential attention (`PAIRED_HEADS`): the heads work in pairs that one rank must hold whole."""

    @classmethod
    def read(cls, fields: dict[str, int]) -> SplitCounts:
        """The counts from their fields as a record written with `dataclasses.asdict` holds them."""
        counts = (fields["heads"], fields["kv_heads"], fields["head_dim"], fields["experts"])
        return cls(*counts, bool(fields.get("head_pairs", False)))


def faithful_counts(model: ModelEntry, tp: int) -> SplitCounts | None:
    """The counts of the real checkpoint a faithful cell of `model` at `tp` stands for (matrix/real_shapes.toml, the
    record its tiny config was derived from: matrix/shapes.py `faithful_groups`); None for a stress cell or a
    faithful one that stands for no checkpoint (its config as written)."""
    shape = split_shaped_name(model.name)[1]
    if base_shape(shape) != "faithful" or model.skip_reason or model.expansion_error:
        return None
    groups = faithful_groups_or_why(model, load_real_shapes(), tuple(sorted({*MATRIX_TP, tp})))
    group = None if isinstance(groups, str) else groups.get(shape)
    if group is None or group.record.source.startswith("as written"):
        return None
    real = group.record
    return SplitCounts(real.heads, real.kv_heads, real.head_dim, real.experts, model.model_type in PAIRED_HEADS)


@dataclass(frozen=True)
class Footprint:
    """An unsharded model's tensors as the memory checks (suites/checks/memory.py) judge each rank's share of them."""

    bytes_by_name: dict[str, int]
    """Bytes of each parameter/buffer (`bytes_by_name`; AutoTP keeps the names of the layers it replaces)."""
    kinds: dict[str, TensorKind]
    """Kind of each name (`tensor_kinds`), from the module types AutoTP has not replaced yet. Tied parameters
    appear under every name they have."""
    shapes_by_name: dict[str, tuple[int, ...]]
    """Shape of each parameter/buffer: the memory check judges every weight of a split kind on its own."""
    counts: SplitCounts
    """The model's head and expert counts: what decides how finely a weight can be split."""

    @property
    def param_bytes(self) -> int:
        return sum(self.bytes_by_name.values())


def footprint(model: CausalLM) -> Footprint:
    counts = split_counts(model)
    return Footprint(
        bytes_by_name=bytes_by_name(model),
        kinds=tensor_kinds(model, counts.experts),
        shapes_by_name=shapes_by_name(model),
        counts=counts,
    )


def split_counts(model: CausalLM) -> SplitCounts:
    """Read with the one config reader the faithful shapes use (matrix/shapes.py `read_shape`). A config that lacks a
    size the reader needs raises its UnreadableConfig (the cell's `setup` failure naming the reader and the key),
    never counts of 0 that would judge its weights as if nothing split."""
    config = model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    try:
        shape = read_shape(config, f"{type(config).__name__}")
    except RegistryError:  # no attention heads or hidden size (e.g. a state-space model): no count applies
        return SplitCounts(0, 0, 0, 0)
    paired = getattr(config, "model_type", "") in PAIRED_HEADS
    return SplitCounts(shape.heads, shape.kv_heads, shape.head_dim, shape.experts, paired)


def shapes_by_name(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    return {name: tuple(tensor.shape) for name, tensor in named}


def bytes_by_name(model: torch.nn.Module) -> dict[str, int]:
    named = [*model.named_parameters(), *model.named_buffers()]  # a tied parameter comes once
    return {name: tensor.numel() * tensor.element_size() for name, tensor in named}


def tensor_kinds(model: CausalLM, experts: int) -> dict[str, TensorKind]:
    """Kind of every parameter and buffer, from the module that holds it (`experts`: the model's `SplitCounts`').
    transformers >= 5 stores MoE experts as fused 3-D parameters ([experts, ...]), not nn.Linear modules: counting only
    nn.Linear would miss them."""
    # transformers leaves get_output_embeddings unannotated.
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None  # type: ignore[no-untyped-call]
    kinds: dict[str, TensorKind] = {}
    for module_name, module in model.named_modules():
        for local, _ in module.named_buffers(recurse=False):
            # Buffers (causal masks, rotary tables) are never what AutoTP splits, whatever their rank.
            kinds.setdefault(f"{module_name}.{local}" if module_name else local, "rest")
        for local, tensor in module.named_parameters(recurse=False):
            name = f"{module_name}.{local}" if module_name else local
            kind: TensorKind
            if isinstance(module, CONV_MODULES):
                kind = "convs"
            elif "experts" in module_name.split(".") or (tensor.dim() >= 3 and experts and tensor.shape[0] == experts):
                kind = "experts"  # fused 3-D experts lead with the expert count (a vision head's 3-D probe does not)
            elif isinstance(module, torch.nn.Embedding) or (output is not None and module is output):
                kind = "embeddings"
            elif isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D":
                kind = "linears"
            else:
                kind = "rest"
            kinds.setdefault(name, kind)
    return kinds
