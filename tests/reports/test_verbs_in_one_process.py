"""Verbs of `python -m reports` chained with `--then` in one process (#58 "the run around the cells": `nox -s matrix`
merges and renders this way): the same files as the verbs run one by one, each verb only after the one before exited 0,
and a usage error anywhere stops them all before any runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reports_testkit import Cell, fail, write_junit

from reports.__main__ import main

RUN = dict(run_id="matrix@2025-01-01T00:00:00Z@runner-1", started="2025-01-01T00:00:00Z")


def rendered(out: Path) -> dict[str, bytes]:
    """Every file of the out folder but the store and its archive, the moment of rendering masked."""
    generated_at = json.loads((out / "report.json").read_text())["generated_at"].encode()
    return {
        path.relative_to(out).as_posix(): path.read_bytes().replace(generated_at, b"<generated_at>")
        for path in sorted(out.rglob("*"))
        if path.is_file() and "archive" not in path.relative_to(out).parts and path.name != "history.sqlite"
    }


def test_merge_then_render_writes_what_the_two_verbs_write(tmp_path, capsys):
    cells = [Cell("llama"), fail("opt", "shard"), fail("bloom", "forward", "RuntimeError: mask", tp=3)]
    for folder in ("apart", "chained"):
        write_junit(tmp_path / folder / "junit" / "matrix.xml", cells, **RUN)
    apart, chained = tmp_path / "apart", tmp_path / "chained"

    assert main(["merge", str(apart / "junit"), "--store", str(apart / "history.sqlite")]) == 0
    assert main(["render", "--store", str(apart / "history.sqlite"), "--out", str(apart)]) == 0
    said_apart = capsys.readouterr().out.replace(str(apart), "<out>")
    store = str(chained / "history.sqlite")
    chain = ["merge", str(chained / "junit"), "--store", store, "--then", "render", "--store", store]
    assert main([*chain, "--out", str(chained)]) == 0
    said_chained = capsys.readouterr().out.replace(str(chained), "<out>")

    assert said_chained == said_apart
    assert "1 new run(s), 3 new result(s)" in said_chained and "2 cells fail" in said_chained
    assert rendered(chained) == rendered(apart)
    assert "report.md" in rendered(chained)


def test_a_verb_that_fails_stops_the_ones_after_it(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    store = str(tmp_path / "history.sqlite")
    command = ["merge", str(tmp_path / "empty"), "--store", store, "--then", "render", "--store", store]
    assert main([*command, "--out", str(tmp_path / "out")]) == 2
    assert "no JUnit (*.xml) file in them" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # render never ran


def test_a_usage_error_in_a_later_verb_stops_all_before_any_runs(tmp_path, capsys):
    write_junit(tmp_path / "junit" / "matrix.xml", [Cell("llama")], **RUN)
    store = tmp_path / "history.sqlite"
    with pytest.raises(SystemExit) as exited:
        main(["merge", str(tmp_path / "junit"), "--store", str(store), "--then", "render", "--out"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m reports render" in err and "argument --out: expected one argument" in err, err
    assert not store.exists()  # merge never ran
