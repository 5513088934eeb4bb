"""Add a model to the matrix: `python -m sessions.add_model <hub id | local checkpoint dir | model_type>`.

Reads the real config (a local folder's config.json, or a hub id from the HF cache: offline when it is cached; the entry
pins the commit that config came from in `revisions`), derives a tiny config that keeps what matters for sharding
(matrix/derive.py), checks that the tiny model builds and runs, appends a `[models.<name>]` table to matrix/models.toml
(refusing a name or hub id that is already there), records the checkpoint's real sizes in matrix/real_shapes.toml (what
its faithful cells split like; class defaults without a hub id), runs its cells at tp 2 and 3 on the tiny checkpoint,
and prints a checklist for the DeepSpeed PR.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomllib
from transformers import AutoConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from matrix import PROJECT_ROOT
from matrix.config_values import UnreadableConfig
from matrix.derive import derive_for_model_type, entry_name, load_derived_data
from matrix.registry import MODELS_FILE, ModelEntry, RegistryError, load_models, parse_model
from matrix.shapes import add_record, read_shape, split_shaped_name
from matrix.shrink import NotDerivable, derive_tiny
from sessions.build_check import build_problem
from suites.records.run_records import read_records
from suites.run.command import suites_command

if TYPE_CHECKING:
    from transformers import PretrainedConfig

CellRecord = dict[str, Any]
"""A line of cells.jsonl as suites.records.run_records.read_records gives it (JSON: nested values of any type)."""

DOCS_TABLE = "docs/_tutorials/automatic-tensor-parallelism.md"


def load_source_config(source: str) -> tuple[PretrainedConfig, str | None, bool]:
    """(config, hub id or None, real): a local folder, a hub id (cache first), or a bare model_type."""

    folder = Path(source).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise RegistryError(f"{folder}: no config.json in this folder; point at a checkpoint folder")
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
        if model_type not in CONFIG_MAPPING:
            raise RegistryError(
                f"{folder}/config.json: model_type {model_type!r} is not in the installed transformers; "
                "remote-code models are added by hand with trust_remote_code = true"
            )
        return AutoConfig.from_pretrained(folder), None, True
    if source in CONFIG_MAPPING:
        return AutoConfig.for_model(source), None, False
    if "/" in source:
        try:
            return AutoConfig.from_pretrained(source, local_files_only=True), source, True
        except OSError:
            try:
                return AutoConfig.from_pretrained(source), source, True
            except OSError as error:
                raise RegistryError(
                    f"{source}: not in the HF cache and not downloadable ({error}); "
                    "download it once or pass a local checkpoint folder"
                ) from None
    raise RegistryError(
        f"{source!r} is neither a folder, a hub id (owner/name) nor a model_type of the installed transformers"
    )


def hub_revision(hub_id: str) -> str:
    """The commit of the cached snapshot whose config.json was read: huggingface_hub keeps each commit's
    files under `snapshots/<commit>/`."""
    # lazily: only fetching from the hub needs huggingface_hub (`nox -s prefetch`, `--checkpoints hub`)
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(hub_id, "config.json")
    if not isinstance(cached, str):
        raise RegistryError(f"{hub_id}: config.json is not in the HF cache, so its revision is unknown")
    return Path(cached).parent.name


def default_name(source: str, model_type: str, hub_id: str | None) -> str:
    base = hub_id.split("/")[-1] if hub_id else (Path(source).name if Path(source).is_dir() else model_type)
    return re.sub(r"_+", "_", re.sub(r"[^a-z0-9]", "_", base.lower())).strip("_") or entry_name(model_type)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{ "
            + ", ".join(
                f"{json.dumps(str(k)) if not re.fullmatch(r'[A-Za-z0-9_-]+', str(k)) else k} = {toml_value(v)}"
                for k, v in value.items()
                if v is not None
            )
            + " }"
        )
    raise RegistryError(f"cannot write {value!r} ({type(value).__name__}) to TOML")


def entry_table(entry: ModelEntry) -> str:
    lines = [f"[models.{entry.name}]", f"model_type = {toml_value(entry.model_type)}"]
    if entry.hub_ids:
        lines.append(f"hub_ids = {toml_value(list(entry.hub_ids))}")
    if entry.revisions:
        lines.append(f"revisions = {toml_value(entry.revisions)}")
    lines.append(f"tiny = {toml_value({k: v for k, v in entry.tiny.items() if v is not None})}")
    lines.append(f"tiny_why = {toml_value(entry.tiny_why)}")
    return "\n".join(lines) + "\n"


def append_entry(entry: ModelEntry, models_file: Path) -> ModelEntry:
    """Append the entry's table; refuse a duplicate name or hub id; return the entry as read back."""
    registry = load_models(models_file)
    if entry.name in registry:
        raise RegistryError(f"{models_file}: [models.{entry.name}] already exists; pass --name to choose another name")
    for other in registry.values():
        shared = set(entry.hub_ids) & set(other.hub_ids)
        if shared:
            raise RegistryError(
                f"{models_file}: hub id {sorted(shared)[0]} is already registered as [models.{other.name}]"
            )
    table = entry_table(entry)
    parsed = parse_model(models_file, entry.name, tomllib.loads(table)["models"][entry.name])
    with models_file.open("a") as stream:
        stream.write("\n" + table)
    return parsed


def run_entry_cells(name: str, models_file: Path, tp: str, results: Path) -> list[CellRecord]:
    results.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        suites_command(
            sys.executable,
            models=name,
            tp=tp,
            models_file=models_file,
            results=results,
            session_name=f"add-model-{name}",
            extra=["-q"],
        ),
        cwd=PROJECT_ROOT,
        check=False,
    )

    return [r for r in read_records(results) if split_shaped_name(r["cell"]["model"])[0] == name]


def checklist(entry: ModelEntry, records: list[CellRecord], models_file: Path) -> str:
    lines = [f"Checklist for the DeepSpeed PR adding {entry.name} ({entry.model_type}):"]
    verdicts = (
        ", ".join(
            f"tp{r['cell']['tp']} {r['outcome']}"
            + (f" ({r['failure_class']}: {r['signature']})" if r["failure_class"] else "")
            for r in records
        )
        or "not run"
    )
    passing = records and all(r["outcome"] == "pass" for r in records)
    lines.append(f"  [{'x' if passing else ' '}] AutoTP cells on the tiny checkpoint: {verdicts}")
    lines.append(f"  [x] matrix entry: [models.{entry.name}] appended to {models_file} (review tiny_why, add hub_ids)")
    lines.append(
        f"  [ ] docs row: add {entry.name} to the supported-models table in DeepSpeed's {DOCS_TABLE}"
        + ("" if passing else " only once its cells pass")
    )
    failing = [r for r in records if r["outcome"] == "fail"]
    if failing:
        lines.append(
            "  [ ] known issues: file a DeepSpeed issue per distinct signature and list its link in "
            f"known_issues of [models.{entry.name}]:"
        )
        lines += [
            f"        - {sig}" for sig in dict.fromkeys(f"{r['failure_class']}: {r['signature']}" for r in failing)
        ]
    elif records:
        lines.append("  [x] known issues: none found at tp " + ",".join(r["cell"]["tp"] for r in records))
    else:
        lines.append("  [ ] known issues: run the cells first (without --no-run)")
    lines.append(
        f"  [ ] run on a GPU runner with the real checkpoint: nox -s matrix -- --checkpoints hub --models {entry.name}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="hub id (owner/name), local checkpoint folder, or transformers model_type")
    parser.add_argument("--name", help="registry name (default: from the hub id, folder or model_type)")
    parser.add_argument("--models-file", type=Path, default=MODELS_FILE, help="registry to append to")
    parser.add_argument("--tp", default="2,3", help="tp sizes to run the new cells at")
    parser.add_argument("--results", type=Path, default=Path("results/add-model"), help="results folder of the run")
    parser.add_argument("--no-run", action="store_true", help="write the entry but do not run its AutoTP cells")
    args = parser.parse_args(argv)
    try:
        config, hub_id, from_checkpoint = load_source_config(args.source)
        # A bare model_type starts from class defaults: the same derivation as `--models derived`, with
        # its fixes and named skips from derived.toml.
        derivation = (
            derive_tiny(config, real=True)
            if from_checkpoint
            else derive_for_model_type(config.model_type, load_derived_data())
        )
        name = args.name or default_name(args.source, config.model_type, hub_id)
        entry = ModelEntry(
            name=name,
            model_type=config.model_type,
            tiny=derivation.tiny,
            tiny_why=derivation.why,
            hub_ids=(hub_id,) if hub_id else (),
            revisions={hub_id: hub_revision(hub_id)} if hub_id else {},
        )
        problem = build_problem(entry)
        if problem:
            raise RegistryError(
                f"the derived tiny config of {args.source} does not build ({problem}); nothing written. "
                f"Derived overrides: {derivation.tiny}"
            )
        real_shape = read_shape(config, f"hub config {hub_id}") if hub_id else None
        entry = append_entry(entry, args.models_file)
        shapes_file = add_record(args.models_file, entry, hub_id, real_shape)
    except (RegistryError, NotDerivable, UnreadableConfig) as error:
        print(f"add-model: {error}", file=sys.stderr)
        return 2
    print(f"added [models.{entry.name}] to {args.models_file}:\n{entry_table(entry)}")
    print(f"recorded its real shape ({hub_id or 'config class defaults'}) in {shapes_file}")
    records = [] if args.no_run else run_entry_cells(entry.name, args.models_file, args.tp, args.results)
    print(checklist(entry, records, args.models_file))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
