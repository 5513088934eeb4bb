"""Redaction at every door (issue #25): secrets planted in every input — a JUnit failure (message, text and the
signature property), a cell record in cells.jsonl read by bisect/triage, a triage reason — appear 0 times in every
output: the store's bytes, report.md/.html/.json, supported-models.md, the step summary, publish's files, gate's
table and every line printed. (Rank logs: tests/suites/engine/test_log_redaction.py.)"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
from reports_testkit import Cell, fail, write_junit

from reports.__main__ import main
from reports.search.cell_runs import classify, run_cells
from reports.store.history_store import HistoryStore
from reports.store.records import Bisection, CellKey, TriageAttempt
from tests import planted_secrets
from tests.planted_secrets import SECRET_ENV, SECRET_VALUE, leaks, leaky_text

LLAMA = CellKey("llama", "eager", "fp32", 2)


@pytest.fixture(autouse=True)
def environment(monkeypatch):
    """The report job's environment: the credential-like variable is set here, GitHub's are not."""
    for name in ("GITHUB_TOKEN", "GITHUB_STEP_SUMMARY", "GITHUB_REPOSITORY", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(SECRET_ENV, SECRET_VALUE)


def two_nightlies(folder: Path) -> None:
    """llama and opt pass in the first nightly and fail in the second with a message quoting every secret."""
    for n, cells in enumerate(
        ([Cell("llama"), Cell("opt")], [fail("llama", "setup", leaky_text()), fail("opt", "shard", leaky_text())]),
        start=1,
    ):
        write_junit(
            folder / f"nightly{n}.xml",
            cells,
            run_id=f"nightly@2025-01-0{n}T00:00:00Z@runner-1",
            started=f"2025-01-0{n}T00:00:00Z",
            deepspeed=f"0.19.{n}",
        )


def written(out: Path, store: Path, printed: str) -> dict[str, bytes]:
    """Every output, by name."""
    files = {str(path.relative_to(out)): path.read_bytes() for path in out.rglob("*") if path.is_file()}
    return {**files, "store": store.read_bytes(), "printed": printed.encode()}


def fake_cell_command(record: dict):
    """A `pytest suites` stand-in for bisect/triage that writes one cells.jsonl record and prints it too."""

    def command(python, cells, results, cell_timeout) -> list[str]:
        line = json.dumps(record)
        return [
            sys.executable,
            "-c",
            f"import pathlib, sys; pathlib.Path({str(results)!r}, 'cells.jsonl')"
            f".write_text(sys.argv[1] + '\\n'); print(sys.argv[1])",
            line,
        ]

    return command


def test_planted_secrets_reach_no_output(tmp_path, capsys):
    two_nightlies(tmp_path / "junit")
    store, out = tmp_path / "history.sqlite", tmp_path / "out"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0

    # bisect/triage read a cell's record from cells.jsonl: what they keep of it (verdicts, reasons) is clean
    record = {
        "cell": {"id": LLAMA.id},
        "outcome": "fail",
        "failure_class": "setup",
        "signature": leaky_text(),
        "message": leaky_text(),
    }
    run = run_cells(Path(sys.executable), [LLAMA], 60, command=fake_cell_command(record))[LLAMA]
    assert leaks(run.signature) == leaks(run.message) == [] and "HTTPError: 401" in run.message
    verdict = classify(run, ("shard", "other"), any_failure=False)
    with HistoryStore(store, create=False) as history:  # what triage records from such runs
        history.add_triage_attempt(
            TriageAttempt(
                LLAMA,
                "deepspeed",
                "broken",
                "0.19.1",
                "0.19.2",
                (("transformers", "4.44.0"),),
                f"every step untestable: {verdict.detail} {leaky_text()}",
                "2025-01-03T00:00:00+00:00",
            )
        )
        history.add_bisection(
            Bisection(
                CellKey("opt", "eager", "fp32", 2),
                "broken",
                "deepspeed",
                "0.19.1",
                "0.19.2",
                (("transformers", "4.44.0"),),
                "shard",
                leaky_text(),
                "a" * 40,
                f"Fix ({leaky_text()}) (#1)",
                1,
                recorded_at="2025-01-03T00:00:00+00:00",
            )
        )

    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    assert main(["publish", "--store", str(store), "--out", str(out)]) == 0
    assert (
        main(
            [
                "gate",
                "--store",
                str(store),
                "--baseline",
                "deepspeed=0.19.1",
                "--candidate",
                "deepspeed=0.19.2",
                "--block-changed",
            ]
        )
        == 1
    )
    captured = capsys.readouterr()
    outputs = written(out, store, captured.out + captured.err)
    assert {
        "report.md",
        "report.json",
        "report.html",
        "supported-models.md",
        "step-summary.md",
        "publish/comment.md",
        "store",
        "printed",
    } <= set(outputs)
    assert any(name.startswith("publish/issues/") for name in outputs)
    # The leaky text did reach every report (redacted), so the test looks where the secrets would be.
    for name in ("report.md", "report.json", "report.html", "step-summary.md", "store"):
        assert b"HTTPError: 401" in outputs[name] and b"***" in outputs[name], name
    assert {name: leaks(data) for name, data in outputs.items() if leaks(data)} == {}


def test_render_and_publish_redact_a_store_written_before_import_did(tmp_path, capsys):
    two_nightlies(tmp_path / "junit")
    store, out = tmp_path / "history.sqlite", tmp_path / "out"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    with sqlite3.connect(store) as conn:  # as an older version stored it: verbatim
        conn.execute(
            "UPDATE texts SET text = ? WHERE id IN (SELECT signature FROM results WHERE outcome = 'fail' "
            "UNION SELECT message FROM results WHERE outcome = 'fail')",
            (leaky_text(),),
        )
    assert planted_secrets.SHAPED[0].encode() in store.read_bytes()
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    assert main(["publish", "--store", str(store), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    outputs = written(out, store, captured.out + captured.err)
    del outputs["store"]  # it still holds what it held; what leaves it is redacted
    assert b"HTTPError: 401" in outputs["report.md"]
    assert {name: leaks(data) for name, data in outputs.items() if leaks(data)} == {}


def test_only_credential_like_variables_of_some_length_are_secrets(monkeypatch):
    from matrix.redaction import redact

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # a TOKEN name, but a value far too common to blank
    monkeypatch.setenv("DEPLOY_KEY", "s3cr3t-deploy-key-value")
    monkeypatch.setenv("AUTOTP_CELL_TIMEOUT", "plainValueNotSecret")
    assert (
        redact("false s3cr3t-deploy-key-value plainValueNotSecret hf_device_map bearer of news")
        == "false *** plainValueNotSecret hf_device_map bearer of news"
    )


def test_a_url_keeps_its_host_and_loses_its_credentials():
    from matrix.redaction import redact

    assert (
        redact("--extra-index-url https://ci-bot:Pl4ntedIndexPassword@pypi.example.com/simple x://a@b")
        == "--extra-index-url https://***@pypi.example.com/simple x://a@b"
    )


@pytest.mark.parametrize("around", ["", "… × — ", "İstanbul İ "])
def test_shaped_tokens_are_found_in_any_letter_case_beside_any_unicode(around):
    """The patterns match a lowercased copy of the text: with "İ" (which lowers to two characters) the copy is the
    ASCII-only translation, otherwise str.lower(); either way each redacted span is the token's, not a neighbour's."""
    from matrix.redaction import redact

    text = (
        f"{around}HF_PLANTEDHUGGINGFACETOKEN0123456789ABCD {around}AUTHORIZATION: Bearer PlantedBearerValue {around}x"
    )
    assert redact(text) == f"{around}*** {around}AUTHORIZATION: Bearer *** {around}x"


def test_the_failing_now_section_render_prints_is_redacted(tmp_path, capsys):
    """render prints the first section from the report it built, not from the redacted files read back: the text it
    prints is redacted itself. The token has no digit, so the cause (numbers masked) keeps it whole."""
    token = "hf_" + "abcdefghijklmopqrstuvwyzabcdefghijk"
    two_nightlies(tmp_path / "junit")
    store, out = tmp_path / "history.sqlite", tmp_path / "out"
    assert main(["merge", str(tmp_path / "junit"), "--store", str(store)]) == 0
    with sqlite3.connect(store) as conn:  # as an older version stored it: verbatim
        conn.execute(
            "UPDATE texts SET text = ? WHERE id IN (SELECT signature FROM results WHERE outcome = 'fail')",
            (f"RuntimeError: rejected {token}",),
        )
    capsys.readouterr()
    assert main(["render", "--store", str(store), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Failing now, by cause (" in printed and "RuntimeError: rejected ***" in printed
    assert token not in printed
