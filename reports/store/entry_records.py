"""An archive entry's records in format 2 (reports.store.archive): the canonical JSON merge writes, and the records
read back from it, typed (a field of the wrong type raises TypeError, KeyError or ValueError)."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

from matrix.json_records import read_record, write_record
from reports.store.records import CellDetail, CellKey, CellResult, JSONObject, Run, RunRecords, Versions
from suites.verdicts.cause import Cause
from suites.verdicts.mechanism import AutoTPRecord, BreakPoint

FORMAT = 2


def entry_json(records: RunRecords) -> bytes:
    """A run's records as an entry of format 2 holds them: canonical JSON (the same records, the same bytes). A
    result's run id is its run's; a run's trust is not kept (only trusted runs are archived)."""
    run = records.run
    content = {
        "format": FORMAT,
        "run": {
            **{f.name: getattr(run, f.name) for f in fields(Run) if f.name not in ("versions", "trusted")},
            "versions": asdict(run.versions),
        },
        "dependencies_as_of": records.dependencies_as_of,
        "results": [
            {
                "cell": asdict(result.cell),
                "outcome": result.outcome,
                "failure_class": result.failure_class,
                "signature": result.signature,
                "message": result.message,
                "metrics": result.metrics,
                "checkpoints": list(result.checkpoints),
                **{
                    name: write_record(mechanism) if mechanism else None
                    for name, mechanism in (
                        ("cause", result.cause),
                        ("broke_at", result.broke_at),
                        ("autotp", result.autotp),
                    )
                },
            }
            for result in records.results
        ],
        "details": [{**asdict(detail), "cell": asdict(detail.cell)} for detail in records.details],
    }
    return json.dumps(content, sort_keys=True, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def from_json(content: JSONObject) -> RunRecords:
    """A format-2 entry's records (its JSON as json.loads gives it), typed; a field of the wrong type raises TypeError
    or KeyError."""
    if content.get("format") != FORMAT:
        raise ValueError(f"format {content.get('format')!r}, not {FORMAT}: written by a newer harness?")
    fields_ = dict(content["run"])
    if "trusted" in fields_:  # only trusted runs are archived, so an entry never says
        raise ValueError(f"its run says trusted={fields_['trusted']!r}: an entry holds a trusted run and never says so")
    run = Run(**{**fields_, "versions": Versions(**fields_["versions"])})
    results = tuple(
        CellResult(
            run_id=run.run_id,
            cell=CellKey(**item["cell"]),
            outcome=item["outcome"],
            failure_class=item["failure_class"],
            signature=item["signature"],
            message=item["message"],
            metrics={name: _number(value) for name, value in item["metrics"].items()},
            checkpoints=tuple(item["checkpoints"]),
            # entries written before causes were kept have none
            cause=read_record(Cause, item["cause"]) if item.get("cause") else None,
            broke_at=read_record(BreakPoint, item["broke_at"]) if item.get("broke_at") else None,
            autotp=read_record(AutoTPRecord, item["autotp"]) if item.get("autotp") else None,
        )
        for item in content["results"]
    )
    details = tuple(CellDetail(**{**item, "cell": CellKey(**item["cell"])}) for item in content["details"])
    return RunRecords(run, results, details, content["dependencies_as_of"])


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a metric {value!r} is not a number")
    return float(value)
