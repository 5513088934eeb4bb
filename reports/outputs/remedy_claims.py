"""What a draft issue claims of a cause's remedies: only a remedy `nox -s remedy` verified (matrix/remedies.py
`verified_remedies`) is claimed, as "Workaround (verified: N of N cells pass, 0 other verdicts changed)" with what to
pass, or "Proposed fix (verified ...)" with the diff; a cause without one claims nothing."""

from __future__ import annotations

from matrix.cells import parse_cell_id
from matrix.registry import RegistryError
from matrix.remedies import RemedyResult
from reports.outputs.markdown_safety import fence


def remedy_sections(cells: tuple[str, ...], remedies: dict[str, tuple[RemedyResult, ...]]) -> str:
    """The sections of the verified remedies of the models of `cells` ("" when none)."""
    return "".join(remedy_section(result) for result in _remedies_of(cells, remedies))


def _remedies_of(cells: tuple[str, ...], remedies: dict[str, tuple[RemedyResult, ...]]) -> list[RemedyResult]:
    """The verified remedies of the cause's models (`nox -s remedy`'s results beside the draft)."""
    models = {_model_of(cell) for cell in cells}
    found = [result for model in sorted(models) for result in remedies.get(model, ())]
    return list({result.remedy: result for result in found}.values())


def _model_of(cell: str) -> str:
    try:
        return parse_cell_id(cell)[0]
    except RegistryError:  # a cell of an entry since renamed: no remedy names it
        return ""


def remedy_section(result: RemedyResult) -> str:
    """ "Workaround (verified: N of N cells pass, 0 other verdicts changed)" with what to pass, or "Proposed fix
    (verified ...)" with the diff: only a verified remedy is claimed."""
    lines = ["", f"**{result.claim()}**", "", result.mechanism, ""]
    if result.kind == "workaround":
        lines += [result.summary, "", *fence(result.how, "python")]
    else:
        lines += [result.summary, "", *fence(result.how.rstrip("\n"), "diff")]
    return "\n".join(lines) + "\n"
