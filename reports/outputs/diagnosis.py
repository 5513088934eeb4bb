"""What AutoTP did to a failing cell's model and where it broke, from the cell's record (suites/verdicts/mechanism.py):
the section of a draft issue (reports.outputs.draft_issue) that says it."""

from __future__ import annotations

from dataclasses import dataclass

from reports.analysis import FailingCause, whose_text
from reports.store import CellResult
from suites.verdicts.mechanism import mask_indices


@dataclass(frozen=True)
class Diagnosis:
    """What AutoTP did to the example cell's model and where it broke, as its record states it (issue #43's
    record of the policy, the replaced modules, the tensors left whole and the breaking module); a draft shows it
    in a section of its own, and nothing where the record carries none."""

    mechanism: str
    """The cause in words: `self_attn.q_norm (width of the split q_proj) left whole`."""
    policy: tuple[str, ...] = ()
    """Per decoder-layer class, the linears DeepSpeed's parser all-reduces: `Phi3DecoderLayer: self_attn.o_proj,
    mlp.down_proj`; a layer kind it gave no policy as `<class>: no policy`."""
    replaced: tuple[str, ...] = ()
    """Each replaced module (layer indices masked) with its DeepSpeed layer class and rank 0's share."""
    left_whole: tuple[str, ...] = ()
    """Parameters or buffers left whole next to a split projection, with the width they have."""
    broke_at: str = ""
    """The module whose forward raised, or the first whose output diverges from the unsharded model's."""
    whose: str = ""
    """Whose it is, in words, with its evidence (reports.analysis.whose_text)."""


def diagnosis_of(entry: FailingCause, result: CellResult) -> Diagnosis | None:
    """The example cell's record as a draft shows it: the cause's mechanism and whose bug, what AutoTP did (rank 0's
    record) and where it broke; None for results recorded before causes were kept."""
    if not entry.mechanism:
        return None
    autotp = result.autotp
    replaced: dict[str, set[str]] = {}
    for module in autotp.replaced if autotp else ():
        replaced.setdefault(module.layer_text, set()).add(mask_indices(module.path))
    return Diagnosis(
        mechanism=entry.mechanism,
        policy=(
            *(f"{p.layer_class}: {', '.join(p.allreduce) or 'nothing'}" for p in autotp.policies),
            *(f"{kind}: no policy" for kind in autotp.unparsed),
        )
        if autotp
        else (),
        replaced=tuple(f"{layer}: {', '.join(sorted(paths))}" for layer, paths in replaced.items()),
        left_whole=tuple(w.text for w in autotp.left_whole) if autotp else (),
        broke_at=result.broke_at.text if result.broke_at else "",
        whose=whose_text(entry),
    )


def diagnosis_lines(diagnosis: Diagnosis | None) -> list[str]:
    """The section "AutoTP's choice and where it broke", from the cell's record; none when it carries nothing."""
    if diagnosis is None:
        return []
    lines = ["**What AutoTP did and where it broke**", "", diagnosis.mechanism.rstrip(".") + "."]
    if diagnosis.whose:
        lines.append(f"Whose: {diagnosis.whose}.")
    lines.append("")
    for title, items in (
        ("Policy DeepSpeed's parser chose (all-reduce after)", diagnosis.policy),
        ("Modules replaced", diagnosis.replaced),
        ("Left whole next to a split", diagnosis.left_whole),
    ):
        if items:
            lines += [f"{title}:", "", *(f"- {item}" for item in items), ""]
    if diagnosis.broke_at:
        lines += [f"Where it broke: {diagnosis.broke_at}", ""]
    return lines
