"""What a user passes besides the model and the tp size: `init_inference`'s `injection_policy`, `from_pretrained`
keywords and what every forward is given. A cell runs with none of them unless a remedy (matrix/remedies.toml)
adds them; they reach the ranks through the cell's job and the standalone script through its CELL values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KwargValue = str | int | float | bool
"""A `from_pretrained` keyword's value as TOML and JSON give it (`attn_implementation = "eager"`)."""

ForwardMask = Literal["", "all-ones"]
"""What a forward without an attention mask is given: nothing (as the probes ask) or an all-ones mask (what a
mask-less forward means, passed explicitly)."""


@dataclass(frozen=True)
class CellArguments:
    """The arguments a cell passes on top of its variant's, all empty by default (the cell as a user runs it with
    nothing extra)."""

    injection_policy: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """`init_inference(injection_policy={Block: ("a.b", ...)})`: each block class, named as `type(module).__name__`
    spells it (resolved among the model's own modules on each rank), with the linears whose output AutoTP must
    all-reduce (the row-parallel ones), in the block's own dotted names."""
    model_kwargs: tuple[tuple[str, KwargValue], ...] = ()
    """Keywords for `from_pretrained` / `from_config` on the ranks (`attn_implementation`, ...); the unsharded
    reference is loaded as without them."""
    forward_mask: ForwardMask = ""
    """`all-ones`: the probes' mask-less forward is given an all-ones attention mask on the ranks (the unsharded
    reference's mask-less logits are what an all-ones mask gives)."""

    def __bool__(self) -> bool:
        return bool(self.injection_policy or self.model_kwargs or self.forward_mask)

    def policy_text(self) -> str:
        """The `injection_policy` as a user writes it: `{CTRLEncoderLayer: ("multi_head_attention.dense", "ffn.2")}`."""
        blocks = ", ".join(f"{block}: {tuple(names)!r}" for block, names in self.injection_policy)
        return f"{{{blocks}}}"

    def describe(self) -> str:
        """One line naming everything passed ("" when nothing is)."""
        parts = [f"injection_policy={self.policy_text()}"] if self.injection_policy else []
        parts += [f"{key}={value!r}" for key, value in self.model_kwargs]
        if self.forward_mask:
            parts.append("attention_mask=torch.ones_like(input_ids) on every forward")
        return ", ".join(parts)


NO_ARGUMENTS = CellArguments()


class UnknownBlockClassError(LookupError):
    """An `injection_policy` names a block class the model does not have (a remedy's typo, or another model's)."""


def resolve_injection_policy(
    policy: tuple[tuple[str, tuple[str, ...]], ...], module_classes: dict[str, type]
) -> dict[type, tuple[str, ...]]:
    """`policy` with each block class name resolved among `module_classes` (name -> class of the model's modules):
    what `init_inference(injection_policy=...)` takes. An unknown name is refused, naming the model's classes."""
    missing = [block for block, _ in policy if block not in module_classes]
    if missing:
        raise UnknownBlockClassError(
            f"injection_policy names block class(es) {missing} the model has no module of; its module classes: "
            f"{', '.join(sorted(module_classes))}"
        )
    return {module_classes[block]: tuple(names) for block, names in policy}
