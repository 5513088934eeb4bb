"""The atlas site from the results archive alone: its pages, their links, what they say, the same bytes from the
same archive, atlas.json changing only where a new transformers release adds verdicts, and the pages in Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from reports_testkit import Cell, fail, write_junit
from test_reports_html import artifacts, chromium, needs_chromium

from reports.__main__ import main
from reports.analysis import cause_id, mask_signature
from reports.store import Bisection, CellKey, ResultsArchive

DEEPSPEED = ("0.16.9", "0.18.9", "0.19.8")
SPLIT = (
    "RuntimeError: split_with_sizes expects split_sizes to sum exactly to 96 (input tensor's size at dimension 0), "
    "but got split_sizes=[64, 0] @ deepspeed/module_inject/layers.py:uneven_partition"
)
BLOOM = (
    "RuntimeError: The size of tensor a (8) must match the size of tensor b (16) @ "
    "transformers/models/bloom/modeling_bloom.py:forward"
)
EXPERTS = "memory: mlp.experts: rank 0 holds 6.75 of 6.75 MiB"
SPLIT_CAUSE = cause_id("shard", mask_signature(SPLIT))
BLOOM_CAUSE = cause_id("forward", mask_signature(BLOOM))
PR = 41234


def cells_at(deepspeed: str, transformers: str) -> list[Cell]:
    old_deepspeed = deepspeed != "0.19.8"
    bloom_broken = transformers >= "5.24.0"
    return [
        *(Cell("llama.faithful", tp=tp, checkpoints=("meta-llama/Llama-2-7b-hf",)) for tp in (2, 3, 4)),
        Cell(
            "llama.faithful",
            "skip" if deepspeed == "0.16.9" else "pass",
            variant="train",
            checkpoints=("meta-llama/Llama-2-7b-hf",),
        ),
        *(
            fail("qwen2.faithful", "shard", SPLIT, tp=tp, checkpoints=("Qwen/Qwen2-7B",))
            if tp == 3 and old_deepspeed
            else Cell("qwen2.faithful", tp=tp, checkpoints=("Qwen/Qwen2-7B",))
            for tp in (2, 3, 4)
        ),
        *(
            fail("bloom.faithful", "forward", BLOOM, tp=tp, checkpoints=("bigscience/bloom-7b1",))
            if bloom_broken
            else Cell("bloom.faithful", tp=tp, checkpoints=("bigscience/bloom-7b1",))
            for tp in (2, 3, 4)
        ),
        fail("afmoe.faithful", "memory", EXPERTS),
    ]


def add_nights(archive_root: Path, transformers: tuple[str, ...], night: int) -> None:
    """One run per version set (as `nox -s atlas` records them), merged into the archive."""
    folder = archive_root.parent / f"junit-{night}"
    for deepspeed in DEEPSPEED:
        for tf in transformers:
            combo = f"ds{deepspeed}-tf{tf}-pt2.13.0"
            write_junit(
                folder / f"{combo}.xml",
                cells_at(deepspeed, tf),
                run_id=f"atlas-inference({combo})@2026-12-{night:02d}T03:17:00Z@runner-1",
                started=f"2026-12-{night:02d}T03:17:00Z",
                deepspeed=deepspeed,
                transformers=tf,
                torch="2.13.0+cpu",
                harness_git="abc1234",
            )
    assert main(["merge", str(folder), "--store", str(archive_root.parent / "history.sqlite")]) == 0


@pytest.fixture
def archive(tmp_path) -> Path:
    root = tmp_path / "archive"
    add_nights(root, ("5.23.0", "5.24.0"), 1)
    answer = Bisection(
        CellKey("bloom.faithful", "eager", "fp32", 2),
        "broken",
        "transformers",
        "5.23.0",
        "5.24.0",
        (("deepspeed", "0.19.8"), ("torch", "2.13.0+cpu")),
        "forward",
        BLOOM,
        commit="a" * 40,
        subject=f"Refactor bloom attention (#{PR})",
        pr=PR,
        recorded_at="2026-12-02T00:00:00Z",
        kind="broke",
        searched_older="5.23.0",
        searched_newer="5.24.0",
    )
    ResultsArchive(root).add_answers([answer])
    return root


def site(archive: Path, out: Path) -> Path:
    assert main(["atlas", "site", "--archive", str(archive), "--out", str(out)]) == 0
    return out


def broken_links(root: Path) -> list[str]:
    """Every href and src of every page that does not resolve: a missing file, or an anchor no element carries."""
    broken = []
    for page in sorted(root.rglob("*.html")):
        text = page.read_text()
        for target in re.findall(r'(?:href|src)="([^"]+)"', text):
            if re.match(r"[a-z]+:", target):  # https://…: a click away, not part of the site
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.is_file():
                broken.append(f"{page.relative_to(root)}: {target} (no such file)")
            elif anchor and f'id="{anchor}"' not in resolved.read_text():
                broken.append(f"{page.relative_to(root)}: {target} (no such anchor)")
    return broken


def test_every_page_kind_is_written_and_every_internal_link_resolves(archive, tmp_path):
    out = site(archive, tmp_path / "site")
    for name in (
        "index.html",
        "atlas.json",
        "checkpoint/Qwen--Qwen2-7B.html",
        "checkpoint/bigscience--bloom-7b1.html",
        "checkpoint/architecture-afmoe.html",
        f"cause/{SPLIT_CAUSE}.html",
        f"cause/{BLOOM_CAUSE}.html",
        "deepspeed/0.19.8.html",
    ):
        assert (out / name).is_file(), name
    assert broken_links(out) == []


REAL_SITE = os.environ.get("AUTOTP_ATLAS_SITE")


@pytest.mark.skipif(not REAL_SITE, reason="AUTOTP_ATLAS_SITE (a site `nox -s atlas -- --site OUT` built) is not set")
def test_a_real_sites_internal_links_resolve():
    """The same check on a site built from a real sample (AUTOTP_ATLAS_SITE=OUT)."""
    root = Path(str(REAL_SITE))
    assert (root / "index.html").is_file() and (root / "atlas.json").is_file()
    assert broken_links(root) == []


def test_the_link_check_finds_a_missing_page(archive, tmp_path):
    out = site(archive, tmp_path / "site")
    (out / "cause" / f"{SPLIT_CAUSE}.html").unlink()
    (out / "index.html").write_text((out / "index.html").read_text() + '<a href="deepspeed/0.19.8.html#nowhere">x</a>')
    broken = broken_links(out)
    assert f"checkpoint/Qwen--Qwen2-7B.html: ../cause/{SPLIT_CAUSE}.html (no such file)" in broken
    assert "index.html: deepspeed/0.19.8.html#nowhere (no such anchor)" in broken


def test_a_checkpoint_page_says_since_when_and_the_first_good_release(archive, tmp_path):
    out = site(archive, tmp_path / "site")
    qwen = (out / "checkpoint" / "Qwen--Qwen2-7B.html").read_text()
    newest = re.search(r"<tr><td>eager fp32 tp3</td>(.*?)</tr>", qwen, re.S)[1]
    # passes at the newest version set (5.24.0 with 0.19.8) since DeepSpeed 0.19.8, since the oldest transformers
    assert "pass" in newest and "<td>0.19.8</td><td>5.23.0</td>" in newest
    assert "fixed at deepspeed 0.18.9 → <b>0.19.8</b> (transformers 5.23.0, 5.24.0)" in qwen
    bloom = (out / "checkpoint" / "bigscience--bloom-7b1.html").read_text()
    assert "broke at transformers 5.23.0 → <b>5.24.0</b> (deepspeed 0.16.9, 0.18.9, 0.19.8)" in bloom
    assert f"#{PR}" in bloom  # the archived answer: the first bad PR
    assert f'href="../cause/{BLOOM_CAUSE}.html"' in bloom


def test_a_cause_page_gives_mechanism_versions_upstream_and_repro(archive, tmp_path):
    out = site(archive, tmp_path / "site")
    page = (out / "cause" / f"{SPLIT_CAUSE}.html").read_text()
    assert 'href="https://github.com/deepspeedai/DeepSpeed/pull/8185"' in page  # matrix/known_failures.toml
    mechanism = re.search(r'<p id="mechanism">(.*?)</p>', page, re.S)[1]
    assert "at deepspeed/module_inject/layers.py:uneven_partition (DeepSpeed&#39;s code)" in mechanism
    assert "96 as [64, 0] on 2 ranks" in mechanism  # the known failure's note
    assert (
        "AUTOTP_PINS=deepspeed=0.18.9,transformers=5.24.0 nox -s repro -- --models qwen2.faithful --variants eager "
        "--dtypes fp32 --tp 3"
    ) in page
    assert "1 cell at 4 version sets" in page
    bloom = (out / "cause" / f"{BLOOM_CAUSE}.html").read_text()
    assert f'href="https://github.com/huggingface/transformers/pull/{PR}"' in bloom  # the answer's first bad PR


def test_a_release_page_counts_what_it_fixed_and_broke_by_cause(archive, tmp_path):
    out = site(archive, tmp_path / "site")
    page = (out / "deepspeed" / "0.19.8.html").read_text()
    assert "fixed 1 cell, broke 0, 0 changed class" in page
    assert f'href="../cause/{SPLIT_CAUSE}.html"' in page and 'href="0.18.9.html"' in page


def test_the_same_archive_gives_the_same_bytes(archive, tmp_path):
    first, second = site(archive, tmp_path / "one"), site(archive, tmp_path / "two")
    names = sorted(path.relative_to(first) for path in first.rglob("*") if path.is_file())
    assert names == sorted(path.relative_to(second) for path in second.rglob("*") if path.is_file())
    assert all((first / name).read_bytes() == (second / name).read_bytes() for name in names)


def test_a_new_transformers_release_changes_atlas_json_only_where_it_adds_verdicts(archive, tmp_path):
    before = json.loads((site(archive, tmp_path / "before") / "atlas.json").read_text())
    add_nights(archive, ("5.25.0",), 2)  # the nightly's increment: the new release at every DeepSpeed
    after = json.loads((site(archive, tmp_path / "after") / "atlas.json").read_text())
    new = set(after["version_sets"]) - set(before["version_sets"])
    assert new == {f"ds{ds}-tf5.25.0-pt2.13.0+cpu-py3.11.7" for ds in DEEPSPEED}
    assert all(after["version_sets"][key] == value for key, value in before["version_sets"].items())
    assert after["rows"].keys() == before["rows"].keys()
    for slug, row in before["rows"].items():
        assert {k: v for k, v in after["rows"][slug].items() if k != "verdicts"} == {
            k: v for k, v in row.items() if k != "verdicts"
        }
        for cell, verdicts in row["verdicts"].items():
            grown = after["rows"][slug]["verdicts"][cell]
            assert {k: v for k, v in grown.items() if k not in new} == verdicts  # nothing old changed
            assert set(grown) - set(verdicts) <= new
    for key, entry in before["causes"].items():
        grown = after["causes"][key]
        assert set(entry["version_sets"]) <= set(grown["version_sets"])
        assert set(grown["version_sets"]) - set(entry["version_sets"]) <= new
        assert {k: v for k, v in grown.items() if k not in ("cells", "version_sets")} == {
            k: v for k, v in entry.items() if k not in ("cells", "version_sets")
        }
    assert all(t in after["transitions"] for t in before["transitions"])
    added = [t for t in after["transitions"] if t not in before["transitions"]]
    assert added and all(t["at"] in new for t in added)
    assert after["archive"]["runs"] == before["archive"]["runs"] + 3


def test_done_counts_each_sessions_cells_and_install_failures(archive, tmp_path, capsys):
    folder = tmp_path / "junit-install"
    write_junit(
        folder / "install.xml",
        [fail("llama", "install", "environment could not be installed")],
        run_id="atlas-inference(ds@master-tf5.24.0-pt2.13.0)@2026-12-03T03:17:00Z@runner-1",
        session="atlas-inference(ds@master-tf5.24.0-pt2.13.0)",
        started="2026-12-03T03:17:00Z",
        deepspeed="master",
        transformers="5.24.0",
    )
    assert main(["merge", str(folder), "--store", str(tmp_path / "history.sqlite")]) == 0
    capsys.readouterr()
    assert main(["atlas", "done", "--archive", str(archive)]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["atlas-inference(ds@master-tf5.24.0-pt2.13.0)"] == {"runs": 1, "cells": 1, "install": 1}
    assert done["atlas-inference(ds0.19.8-tf5.24.0-pt2.13.0)"] == {"runs": 1, "cells": 11, "install": 0}


def test_a_folder_that_is_no_atlas_is_never_replaced(archive, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["atlas", "site", "--archive", str(archive), "--out", str(out)]) == 2
    assert "not an atlas site" in capsys.readouterr().err and (out / "notes.txt").exists()


@needs_chromium
def test_each_page_kind_renders_in_headless_chromium(archive, tmp_path):
    """index, a checkpoint page, a cause page and a release page as a person sees them: screenshots kept as artifacts;
    the index's heat map is drawn by its script (the DOM after it ran names the families it shows)."""
    from PIL import Image

    out = site(archive, tmp_path / "site")
    kept = artifacts(tmp_path)
    pages = {
        "index": out / "index.html",
        "checkpoint": out / "checkpoint" / "Qwen--Qwen2-7B.html",
        "cause": out / "cause" / f"{SPLIT_CAUSE}.html",
        "release": out / "deepspeed" / "0.19.8.html",
    }
    for kind, page in pages.items():
        screenshot = kept / f"atlas-{kind}.png"
        chromium(page, tmp_path / f"profile-{kind}", f"--screenshot={screenshot}", "--window-size=1200,900")
        image = Image.open(screenshot).convert("RGB")
        assert len(image.getcolors(maxcolors=1 << 20)) > 20, f"{kind}: screenshot looks blank"
    dom = chromium(pages["index"], tmp_path / "profile-dom", "--dump-dom").stdout
    assert re.search(r'id="shown"[^>]*>4 of 4 families<', dom), "the heat map's script did not run"
    shutil.copytree(out, kept / "atlas-site", dirs_exist_ok=True)
