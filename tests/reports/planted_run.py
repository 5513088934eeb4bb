"""A results folder with secrets planted in every input path a runner controls (issue #42), the commands that read it,
and every byte they leave behind: the archive (its entries unpacked), the store, every output file and everything
printed. tests/reports/test_planted_secrets.py asserts on it; run as a script against another checkout of the harness
it prints how many planted secrets and fragments that checkout leaves (the figures before and after the fix):

    PYTHONPATH=<checkout> python tests/reports/planted_run.py <scratch folder> merge|render|never
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import io
import json
import os
import sys
import tarfile
from pathlib import Path
from typing import cast

from junitparser.xunit2 import JUnitXml, TestCase

sys.path.insert(0, str(Path(__file__).parent))
from reports_testkit import Cell, fail, write_junit  # noqa: E402

ENV_NAME = "AUTOTP_TEST_PLANTED_TOKEN"
# No token shape: a secret only because of its variable's name. Its digits follow digits, so a number masker that ran
# before the redactor would leave most of it ("QzXv7W3NKpL9MjRt4Yb" is no longer the value the redactor looks for).
ENV_SECRET = "QzXv7W31KpL9MjRt4Yb"
SHAPED = {  # prefix -> token; the part after the prefix is what must not show, whole or in part
    "hf_": "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",
    "ghp_": "ghp_ZyXwVuTsRqPoNmLkJiHgFeDcBaZyXwVuTsRq",
    "github_pat_": "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w",
}
BEARER = "QwErTyZxKpLmJcByHs"  # after `Bearer `
AUTHORIZATION = "ZxCvBnMqWrTyUiOp"  # after `Authorization: token `
SHAPED_SECRETS = [token.removeprefix(prefix) for prefix, token in SHAPED.items()] + [BEARER, AUTHORIZATION]
FRAGMENT = 4  # no 4-character piece of a secret may show
# Issue #53: what the prefix list did not know. Each planted as written (first) and what must not show of it (second,
# in no LONG_FRAGMENT-character piece): unprefixed values named as credentials, shapes of other services, and
# tokens hidden by an encoding or a line break.
HF_RAW = "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"
CRAFTED = {
    "named, no prefix": ("HF_TOKEN=q8RwTz5LmNpQ2vXc7YbKd9", "q8RwTz5LmNpQ2vXc7YbKd9"),
    "named, 40 hex": (
        "'WANDB_API_KEY': '9c1f2e3d4b5a69788796a5b4c3d2e1f0a9b8c7d6'",
        "9c1f2e3d4b5a69788796a5b4c3d2e1f0a9b8c7d6",
    ),
    "aws secret": ("aws_secret_access_key=wJalrXUtnFEMIK7MDENGbPxRfiCYzQ9vLk2", "wJalrXUtnFEMIK7MDENGbPxRfiCYzQ9vLk2"),
    "aws key id": ("AKIAQZWXRTYUPLMNBVCD", "QZWXRTYUPLMNBVCD"),
    "private key": (
        "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"
        "\\n-----END PRIVATE KEY-----",
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7",
    ),
    "jwt": (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwbGFudGVkIn0.Qm9vUlp4VzlLcEx0TmJ2Q3hZbVFk",
        "eyJzdWIiOiJwbGFudGVkIn0.Qm9vUlp4VzlLcEx0TmJ2Q3hZbVFk",
    ),
    "npm": ("npm_ZqXwCeVrBtNyMuLiKoJpHgFdSaQwErTyUiOp", "ZqXwCeVrBtNyMuLiKoJpHgFdSaQwErTyUiOp"),
    "slack": (
        "xoxb-2389471023-9834710293847-QpWoEiRuTyAlSkDjFhGzXmCn",
        "2389471023-9834710293847-QpWoEiRuTyAlSkDjFhGzXmCn",
    ),
    "google": ("AIzaSyQwErTyUiOpAsDfGhJkLzXcVbNm1234567", "SyQwErTyUiOpAsDfGhJkLzXcVbNm1234567"),
    "openai": ("sk-proj-PoIuYtReWqLkJhGfDsAzMxNcBv0987654321", "PoIuYtReWqLkJhGfDsAzMxNcBv0987654321"),
    "url password": ("https://bot:hunter2@index.example/simple", "hunter2"),
    "base64 of user:hf_": (base64.b64encode(f"user:{HF_RAW}".encode()).decode(), HF_RAW.removeprefix("hf_")),
    "percent-escaped": (HF_RAW.replace("_", "%5F"), HF_RAW.removeprefix("hf_")),
    "json-escaped": (HF_RAW.replace("_", "\\u005f"), HF_RAW.removeprefix("hf_")),
    "wrapped": (f"{HF_RAW[:9]}\n    {HF_RAW[9:]}", HF_RAW.removeprefix("hf_")),
}
LONG_FRAGMENT = 8


def leaky(where: str) -> str:
    """A failure text quoting every secret, as a careless exception or log line might."""
    return (
        f"RuntimeError: {where} 401 for https://huggingface.co (headers: {{'Authorization': 'Bearer {BEARER}'}}) "
        f"Authorization: token {AUTHORIZATION} password={ENV_SECRET} tokens {' '.join(SHAPED.values())} "
        + " | ".join(planted for planted, _ in CRAFTED.values())
    )


HOST = f"r-{ENV_SECRET}-{SHAPED['hf_']}"  # a run field, and so part of the run id


def write_results(results: Path) -> list[Path]:
    """nightly 1 passes; nightly 2 fails with secrets in its failure message, text, signature, system-out, a skip
    message, the logs property, its host and run id, and in the cells.jsonl beside it; nightly 3 plants one in a
    value merge refuses (checkpoint.revision); nightly 4 contradicts nightly 2 with a leaky signature."""
    junit = results / "junit"
    runs = []
    for n, cells in (
        (1, [Cell("llama"), Cell("opt")]),
        (2, [fail("llama", "forward", leaky("signature"), message=leaky("text")), Cell("opt", "skip")]),
    ):
        runs.append(
            write_junit(
                junit / f"nightly{n}.xml",
                cells,
                run_id=f"nightly@2025-01-0{n}T00:00:00Z@{HOST if n == 2 else 'runner-1'}",
                started=f"2025-01-0{n}T00:00:00Z",
                host=HOST if n == 2 else "runner-1",
                deepspeed=f"0.19.{n}",
            )
        )
    xml = JUnitXml.fromfile(str(runs[1]))
    for suite in xml:
        for case in suite:
            case = cast(TestCase, case)
            if case.name == "test_cell[llama-eager-fp32-tp2]":
                case.result[0].message = leaky("message")
                case.system_out = leaky("system-out")
                case.add_property("logs", f"/runner/{SHAPED['ghp_']}/logs")
            else:
                case.result[0].message = leaky("skip")
    xml.write(str(runs[1]), pretty=True)
    refused = write_junit(
        results / "refused" / "junit" / "nightly3.xml",
        [Cell("llama")],
        run_id="nightly@2025-01-03T00:00:00Z@runner-1",
        started="2025-01-03T00:00:00Z",
    )
    refused.write_text(
        refused.read_text().replace(
            '<property name="cell.id"',
            f'<property name="checkpoint.revision" value="{SHAPED["github_pat_"]}"/><property name="cell.id"',
            1,
        )
    )
    contradicting = write_junit(
        results / "contradicting" / "junit" / "nightly2.xml",
        [fail("llama", "shard", leaky("conflicting signature"))],
        run_id=f"nightly@2025-01-02T00:00:00Z@{HOST}",
        started="2025-01-02T00:00:00Z",
        host=HOST,
        deepspeed="0.19.2",
    )
    record = {
        "cell": {"id": "llama-eager-fp32-tp2", "model": "llama", "variant": "eager", "dtype": "fp32", "tp": "2"},
        "outcome": "fail",
        "failure_class": "forward",
        "signature": leaky("cells.jsonl signature"),
        "message": leaky("cells.jsonl message"),
        "versions": {"deepspeed": "0.19.2", "transformers": "4.44.0", "torch": "2.4.0", "python": "3.11.7"},
        "run": {"id": f"nightly@2025-01-02T00:00:00Z@{HOST}", "host": HOST},
        "metrics": {},
    }
    (results / "cells.jsonl").write_text(json.dumps(record) + "\n")
    return [junit, refused.parent, contradicting.parent]


def run_commands(folder: Path, set_at: str, main) -> dict[str, str]:
    """Merge, verify, rebuild, render, publish (with upstream reports), draft-issue, gate and archive-needs over the
    planted results, with the secret's variable set for all of them (`merge`), only for those that make reports
    (`render`), or never; return what each printed."""
    results, store, out = folder / "results", folder / "results" / "history.sqlite", folder / "out"
    inputs = write_results(results)
    printed = {}

    def command(name: str, *args: str, reports: bool) -> None:
        if set_at == "merge" or set_at == "render" and reports:
            os.environ[ENV_NAME] = ENV_SECRET
        else:
            os.environ.pop(ENV_NAME, None)
        out_text, err_text = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out_text), contextlib.redirect_stderr(err_text):
            try:
                main([name, *args])
            except SystemExit:  # an older checkout's argparse
                pass
        printed[f"{name} {' '.join(args)}"] = out_text.getvalue() + err_text.getvalue()

    try:
        command("merge", *map(str, inputs), "--store", str(store), reports=False)
        command("verify", "--store", str(store), reports=False)
        names = folder / "names.txt"
        names.write_text("".join(f"{p.relative_to(results / 'archive')}\n" for p in (results / "archive").rglob("*.*")))
        command("archive-needs", str(inputs[0]), "--names", str(names), "--store", str(store), reports=False)
        store.rename(folder / "merged.sqlite")
        command("rebuild", "--store", str(store), reports=False)
        command("render", "--store", str(store), "--out", str(out), reports=True)
        command(
            "publish", "--store", str(store), "--out", str(out), "--upstream", "deepspeedai/DeepSpeed", reports=True
        )
        command("draft-issue", "--cell", "llama-eager-fp32-tp2", "--store", str(store), "--out", str(out), reports=True)
        gate = ("--baseline", "deepspeed=0.19.1", "--candidate", "deepspeed=0.19.2")
        command("gate", "--store", str(store), *gate, reports=True)
    finally:
        os.environ.pop(ENV_NAME, None)
    return printed


def left_behind(folder: Path, printed: dict[str, str]) -> dict[str, dict[str, str]]:
    """Everything the commands left, by where it was made: at merge time (the archive, unpacked, the stores and what
    merge, verify, archive-needs and rebuild printed) and at render time (every output file and what render, publish,
    draft-issue and gate printed)."""
    merge_time, render_time = {}, {}
    for path in sorted((folder / "results" / "archive").rglob("*")):
        if path.is_file():
            merge_time[str(path)] = path.name + "\n" + _unpacked(path)
    for store in (folder / "merged.sqlite", folder / "results" / "history.sqlite"):
        merge_time[str(store)] = store.read_bytes().decode("utf-8", errors="replace")
    for path in sorted((folder / "out").rglob("*")):
        if path.is_file():
            render_time[str(path)] = path.read_bytes().decode("utf-8", errors="replace")
    for name, text in printed.items():
        made = render_time if name.split()[0] in ("render", "publish", "draft-issue", "gate") else merge_time
        made[f"printed by {name.split()[0]}"] = text
    return {"merge": merge_time, "render": render_time}


def _unpacked(path: Path) -> str:
    data = path.read_bytes()
    if path.name.endswith(".tar.gz"):
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
            data = b"".join(tar.extractfile(member).read() for member in tar if member.isfile())
    return data.decode("utf-8", errors="replace")


def found(texts: dict[str, str], secrets: list[str], fragment: int = FRAGMENT) -> dict[str, int]:
    """Per place, how many times a secret or a `fragment`-character piece of one shows (each piece counted)."""
    pieces = {secret[i : i + fragment] for secret in secrets for i in range(max(len(secret) - fragment + 1, 1))}
    counts = {}
    for where, text in texts.items():
        count = sum(text.count(piece) for piece in pieces)
        if count:
            counts[where] = count
    return counts


def whole(texts: dict[str, str], secrets: list[str]) -> dict[str, int]:
    """Per place, how many times a secret shows whole."""
    counts = {where: sum(text.count(secret) for secret in secrets) for where, text in texts.items()}
    return {where: count for where, count in counts.items() if count}


def secrets_in(folder: Path, set_at: str, printed: dict[str, str]) -> dict[str, dict[str, int]]:
    """What the secrets left, whole and in 4-character pieces: shaped tokens are secrets wherever they go; the
    variable's value only where it was set when that text was made (set at merge: everything; set for render only:
    the reports and what their commands printed; never set: nowhere, it is no secret then)."""
    made = left_behind(folder, printed)
    everything = {**made["merge"], **made["render"]}
    result = {
        "shaped tokens, whole": whole(everything, [*SHAPED.values(), BEARER, AUTHORIZATION]),
        "shaped tokens, 4-character pieces": found(everything, SHAPED_SECRETS),
        "crafted secrets, 8-character pieces": found(
            everything, [hidden for _, hidden in CRAFTED.values()], LONG_FRAGMENT
        ),
    }
    judged = {"merge": everything, "render": made["render"]}.get(set_at)
    if judged is not None:
        result["the variable's value, whole"] = whole(judged, [ENV_SECRET])
        result["the variable's value, 4-character pieces"] = found(judged, [ENV_SECRET])
    return result


if __name__ == "__main__":
    from reports.__main__ import main as reports_main

    scratch, mode = Path(sys.argv[1]), sys.argv[2]
    scratch.mkdir(parents=True, exist_ok=False)
    outputs = run_commands(scratch, mode, reports_main)
    for kind, places in secrets_in(scratch, mode, outputs).items():
        print(f"{kind}: {sum(places.values())} in {len(places)} place(s)")
        for where, count in places.items():
            print(f"  {count:6d}  {where.replace(str(scratch), '')}")
