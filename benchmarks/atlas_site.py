"""The atlas's site at its full size: a synthetic atlas of 150,000 cells × 30 nights rendered, against its targets.

    python benchmarks/atlas_site.py [--nights 30] [--models 131] [--out /tmp/autotp-atlas-bench]

The atlas's shape at its full size (matrix/atlas.toml): 7 DeepSpeed values (six minors and master) × 43 transformers
minors = 301 version sets, each holding every model at tp 2, 3, 4 (eager fp32) and the training row of a quarter of
them: 134 models give 504 cells a version set, 151,704 in all. Every one of them is observed on each of 30 nights
(4.5 M results: the heaviest reading of "30 nights", as if every night re-ran the whole atlas). Its history is
shaped like the real one: a model family fails from one DeepSpeed release to another with the family's cause, some
break at a transformers release, architectures younger than a transformers release skip before it, training skips
before DeepSpeed 0.17, one point in 200 is flaky; 60 archived answers name a PR; half the models stand for one or two
real checkpoints.

The results go through the atlas's own reader (reports.atlas.AtlasReader: grouped as they come, a night at a time,
as it reads an archive's entries; no JUnit is written or parsed) and analysis, then its pages are rendered and
written (reports.atlas.write_site). Printed: seconds for each phase, the whole, peak memory (ru_maxrss of this
process), the number and size of the pages, the largest page, each against its target (issue #45: ≤ 60 s, ≤ 1 GB,
every page ≤ 300 KB).
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from reports.atlas import AtlasReader, build_atlas, write_site
from reports.store import Bisection, CellKey, CellResult, Run, Versions

TARGETS = {"seconds": 60.0, "peak_mb": 1024.0, "page_kb": 300.0}
DEEPSPEED = ["0.14.5", "0.15.4", "0.16.9", "0.17.6", "0.18.9", "0.19.8", "0.20.0+1a2b3c4"]
TRANSFORMERS = [f"4.{minor}.{minor % 5}" for minor in range(41, 58)] + [f"5.{minor}.{minor % 3}" for minor in range(26)]
MASTER_GIT = "1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"
CAUSES = [
    (
        "shard",
        "RuntimeError: split_with_sizes expects split_sizes to sum exactly to {n} @ "
        "deepspeed/module_inject/layers.py:uneven_partition",
    ),
    ("forward", "RuntimeError: mat1 and mat2 shapes cannot be multiplied @ deepspeed/module_inject/layers.py:forward"),
    ("numerics", "logits: prefill logits differ by {n} ulps"),
    ("memory", "mlp.experts left whole on every rank: rank 0 holds {n} of {n} MiB"),
    (
        "forward",
        "AttributeError: 'LinearAllreduce' object has no attribute 'weight_{n}' @ "
        "transformers/models/x/modeling_x.py:forward",
    ),
]


def versions(ds: int, tf: int) -> Versions:
    git = MASTER_GIT if ds == len(DEEPSPEED) - 1 else ""
    return Versions(DEEPSPEED[ds], TRANSFORMERS[tf], "2.13.0+cpu", "3.11.7", git)


def synthetic_models(count: int, rng: random.Random) -> list[dict[str, Any]]:
    """Per model: its family's cause and the DeepSpeed range it fails in, a transformers break, its first release."""
    models = []
    for index in range(count):
        family = f"family{index // 2:03d}"
        models.append(
            {
                "name": f"arch{index:03d}.faithful",
                "family": family,
                "checkpoints": tuple(f"org{index % 17}/{family}-{size}B" for size in (7, 70)[: 1 + index % 2])
                if index % 2
                else (),
                "cause": (index // 2) % 60,
                "ds_broken": (rng.randrange(3), rng.randrange(3, len(DEEPSPEED) + 1)) if index % 3 else (0, 0),
                "tf_break": rng.randrange(len(TRANSFORMERS) + 10),
                "born": rng.randrange(len(TRANSFORMERS) // 2) if index % 5 == 0 else 0,
                "training": index % 4 == 0,
            }
        )
    return models


def outcome(
    model: dict[str, Any], variant: str, tp: int, ds: int, tf: int, flaky: bool, night: int
) -> tuple[str, str, str]:
    if tf < model["born"] or (variant == "train" and ds < 3):
        return "skip", "", ""
    low, high = model["ds_broken"]
    failing = low <= ds < high or tf >= model["tf_break"] or (tp == 3 and model["cause"] % 7 == 0)
    if flaky and night % 2:
        failing = not failing
    if not failing:
        return "pass", "", ""
    failure_class, text = CAUSES[model["cause"] % len(CAUSES)]
    return "fail", failure_class, text.format(n=_letters(model["cause"]))


def _letters(number: int) -> str:
    """A cause's own word (digits would be masked: reports.analysis.cause)."""
    return "".join("abcdefghij"[int(digit)] for digit in str(number))


def nights_of(models: list[dict[str, Any]], nights: int, seed: int) -> Iterator[list[tuple[Run, list[CellResult]]]]:
    """Each night's runs, one per version set, each holding every cell."""
    rng = random.Random(seed)
    flaky = {
        (m, ds, tf)
        for m in range(len(models))
        for ds in range(len(DEEPSPEED))
        for tf in range(len(TRANSFORMERS))
        if rng.random() < 0.005
    }
    for night in range(nights):
        started = f"2026-{11 + night // 28:02d}-{1 + night % 28:02d}T03:17:00Z"
        runs = []
        for ds in range(len(DEEPSPEED)):
            for tf in range(len(TRANSFORMERS)):
                run = Run(
                    f"atlas@{started}@runner-{ds}-{tf}",
                    f"atlas-inference(ds{ds}-tf{tf})",
                    f"runner-{ds}-{tf}",
                    started,
                    "cpu",
                    "gloo",
                    versions(ds, tf),
                    "abc1234",
                )
                batch = []
                for index, model in enumerate(models):
                    for variant in ("eager", "train") if model["training"] else ("eager",):
                        for tp in (2, 3, 4):
                            status, failure_class, signature = outcome(
                                model, variant, tp, ds, tf, (index, ds, tf) in flaky, night
                            )
                            batch.append(
                                CellResult(
                                    run.run_id,
                                    CellKey(model["name"], variant, "fp32", tp),
                                    status,
                                    failure_class,
                                    signature,
                                    checkpoints=model["checkpoints"],
                                )
                            )
                runs.append((run, batch))
        yield runs


def answers(models: list[dict[str, Any]], rng: random.Random) -> list[Bisection]:
    found = []
    for model in rng.sample(models, min(60, len(models))):
        low, high = model["ds_broken"]
        if 0 < high < len(DEEPSPEED) - 1:
            failure_class, text = CAUSES[model["cause"] % len(CAUSES)]
            found.append(
                Bisection(
                    CellKey(model["name"], "eager", "fp32", 2),
                    "fixed",
                    "deepspeed",
                    DEEPSPEED[high - 1],
                    DEEPSPEED[high],
                    (("transformers", TRANSFORMERS[0]), ("torch", "2.13.0+cpu"), ("python", "3.11.7")),
                    failure_class,
                    text,
                    commit="f" * 40,
                    subject="[AutoTP] a fix",
                    pr=8000 + model["cause"],
                    recorded_at="2026-12-01T00:00:00Z",
                    kind="fixed",
                )
            )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--models", type=int, default=134)
    parser.add_argument("--out", type=Path, default=Path("/tmp/autotp-atlas-bench"))
    args = parser.parse_args()
    rng = random.Random(45)
    models = synthetic_models(args.models, rng)
    shutil.rmtree(args.out, ignore_errors=True)
    reader = AtlasReader()
    results, generating, reading = 0, 0.0, 0.0
    clock = time.perf_counter()
    for night in nights_of(models, args.nights, 45):
        made = time.perf_counter()
        for run, batch in night:
            reader.add(run, batch)
            results += len(batch)
        clock, generating, reading = (
            time.perf_counter(),
            generating + made - clock,
            reading + time.perf_counter() - made,
        )
    began = time.perf_counter() - reading  # the whole: the atlas's own work, the synthetic results' making aside
    fed = time.perf_counter()
    archived = reader.history(answers(models, rng))
    analysed = time.perf_counter()
    atlas = build_atlas(archived, {})
    built = time.perf_counter()
    written = write_site(atlas, args.out)
    done = time.perf_counter()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    pages = [path for path in written if path.suffix == ".html"]
    sizes = sorted(((path.stat().st_size / 1024, path) for path in pages), reverse=True)
    total = done - began
    print(
        f"synthetic atlas: {len(atlas.verdicts):,} cells (version sets {len(atlas.version_sets)} × "
        f"{len(atlas.verdicts) // len(atlas.version_sets)}), {args.nights} nights = {results:,} results"
    )
    print(f"  (making the synthetic results {generating:6.1f} s, not counted)")
    print(f"  read (grouped as they come) {reading:6.1f} s")
    print(
        f"  history analysed            {analysed - fed:6.1f} s   ({len(archived.history.transitions):,} transitions)"
    )
    print(
        f"  atlas built                 {built - analysed:6.1f} s   ({len(atlas.rows)} rows, {len(atlas.causes)} "
        f"causes)"
    )
    print(f"  pages rendered and written  {done - built:6.1f} s   ({len(written):,} files)")
    print(f"whole                  {total:8.1f} s    target <= {TARGETS['seconds']:.0f} s: {verdict(total, 'seconds')}")
    print(
        f"peak memory            {peak_mb:8.1f} MB   target <= {TARGETS['peak_mb']:.0f} MB: "
        f"{verdict(peak_mb, 'peak_mb')}"
    )
    largest, path = sizes[0]
    print(
        f"largest page           {largest:8.1f} KB   target <= {TARGETS['page_kb']:.0f} KB: "
        f"{verdict(largest, 'page_kb')} "
        f"({path.relative_to(args.out)})"
    )
    for kind in ("index.html", "checkpoint/", "cause/", "deepspeed/"):
        of_kind = [size for size, path in sizes if kind in str(path.relative_to(args.out))]
        print(
            f"  {kind:12s} {len(of_kind):5d} pages, largest {max(of_kind):7.1f} KB, mean "
            f"{sum(of_kind) / len(of_kind):6.1f} KB"
        )
    print(f"atlas.json             {(args.out / 'atlas.json').stat().st_size / 1e6:8.1f} MB")


def verdict(value: float, target: str) -> str:
    return "OK" if value <= TARGETS[target] else "MISSED"


if __name__ == "__main__":
    main()
