"""Tiny configs derived automatically, for every causal-LM architecture transformers ships.

A config shrinks by the rules of matrix/shrink.py (`derive_tiny`), which work on attribute *names*
(matrix/config_keys.py), so a new architecture with the usual names needs no code; `matrix/derived.toml` holds
the few per-architecture fixes and the named skips.

`derived_entries(registry)` gives a ModelEntry for every architecture in the installed transformers'
causal-LM mapping that the registry does not cover; one that cannot be built tiny carries a
`skip_reason`, so it is reported as a skip instead of silently missing. A skip may hold at some
transformers releases only (`[[skip_at.<model_type>]]`: a transformers bug fixed later, a class that
lost generate()); it is then asked of the installed release.

`python -m matrix.derive` lists what is derived and what is skipped; `python -m sessions.build_check`
runs the cell setup (tiny checkpoint + unsharded reference) of every derived architecture on CPU and
lists the failures: the way to keep the skip list honest.
"""

from __future__ import annotations

import argparse
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import transformers
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.utils import logging as hf_logging

from matrix.config_values import UNREADABLE_CONFIG, ExpansionError, UnreadableConfig
from matrix.registry import MATRIX_DIR, SKIPPABLE_PROBES, ModelEntry, RegistryError, load_models, read_toml
from matrix.shapes.layer_kinds import LAYER_FIELDS
from matrix.shrink import Derivation, NotDerivable, derive_tiny
from matrix.toml_tables import TableError, read_table, written_as

DERIVED_FILE = MATRIX_DIR / "derived.toml"


@dataclass(frozen=True)
class VersionSkip:
    """A skip that holds only at the transformers releases `transformers` (a PEP 440 specifier) names."""

    transformers: str = field(metadata=written_as("a quoted version range: transformers = '>=4.46, <4.54'"))
    reason: str

    def applies(self, transformers_version: str) -> bool:
        return SpecifierSet(self.transformers).contains(Version(transformers_version), prereleases=True)

    def validate(self) -> None:
        """derived.toml's rules beyond the fields' types (toml_tables.read_table)."""
        if not self.reason.strip():
            raise TableError("reason", f"needs a non-empty string, got {self.reason!r}")
        try:
            releases = SpecifierSet(self.transformers)
        except InvalidSpecifier:
            releases = SpecifierSet()
        if not releases:  # not a specifier, or empty (it would hold at every release)
            raise TableError(
                "transformers",
                f"must be a version range such as '>=4.46, <4.54' (use [skip] for every release), got "
                f"{self.transformers!r}",
            )


@dataclass(frozen=True)
class DerivedData:
    """matrix/derived.toml: per-architecture fixes the rules cannot know, and named skips."""

    fixes: dict[str, dict[str, Any]]
    skips: dict[str, str]
    version_skips: dict[str, tuple[VersionSkip, ...]] = field(default_factory=dict)
    """[[skip_at.<model_type>]]: skips that hold at some transformers releases only."""
    probe_skips: dict[str, dict[str, str]] = field(default_factory=dict)
    """[probe_skip.<model_type>]: probes the architecture cannot run (ModelEntry.probe_skips), each with its reason."""

    def skip_reason(self, model_type: str, transformers_version: str) -> str | None:
        """Why `model_type` is not derived at `transformers_version`, or None."""
        if model_type in self.skips:
            return self.skips[model_type]
        for skip in self.version_skips.get(model_type, ()):
            if skip.applies(transformers_version):
                return f"{skip.reason} (transformers {transformers_version}; skipped at {skip.transformers})"
        return None


def _parse_version_skips(path: Path, raw: object, skips: dict[str, str]) -> dict[str, tuple[VersionSkip, ...]]:
    """[[skip_at.<model_type>]] tables (one per range of releases; a single [skip_at.<model_type>] table works too)."""
    if not isinstance(raw, dict):
        raise RegistryError(f"{path}: skip_at must be tables [[skip_at.<model_type>]], got {raw!r}")
    parsed = {}
    for model_type, tables in raw.items():
        where = f"{path}: [[skip_at.{model_type}]]"
        if model_type in skips:
            raise RegistryError(f"{where}: {model_type!r} is already skipped at every release by [skip]")
        tables = [tables] if isinstance(tables, dict) else tables
        if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
            raise RegistryError(f"{where} must be tables with 'transformers' and 'reason', got {raw[model_type]!r}")
        parsed[model_type] = tuple(read_table(VersionSkip, table, where=where, error=RegistryError) for table in tables)
    return parsed


def load_derived_data(path: Path = DERIVED_FILE) -> DerivedData:
    raw = read_toml(path)
    unknown = set(raw) - {"fix", "skip", "skip_at", "probe_skip"}
    if unknown:
        raise RegistryError(
            f"{path}: unknown table(s) {sorted(unknown)}; use [fix.<model_type>], [skip], [[skip_at.<model_type>]] "
            "and [probe_skip.<model_type>]"
        )
    skips = raw.get("skip", {})
    for model_type, reason in skips.items():
        if not isinstance(reason, str) or not reason.strip():
            raise RegistryError(f"{path}: [skip] {model_type!r} needs a non-empty reason string")
    probe_skips = raw.get("probe_skip", {})
    for model_type, probes in probe_skips.items():
        if not isinstance(probes, dict) or not probes or set(probes) - set(SKIPPABLE_PROBES):
            raise RegistryError(
                f"{path}: [probe_skip.{model_type}] must give reasons to probes of {list(SKIPPABLE_PROBES)}, got "
                f"{probes!r}"
            )
    return DerivedData(
        fixes=raw.get("fix", {}),
        skips=skips,
        version_skips=_parse_version_skips(path, raw.get("skip_at", {}), skips),
        probe_skips=probe_skips,
    )


def causal_lm_model_types() -> list[str]:
    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def entry_name(model_type: str) -> str:
    return model_type.replace("-", "_").lower()


def _merge(base: dict[str, Any], fix: dict[str, Any]) -> dict[str, Any]:
    """`fix` over `base`, recursing into sub-config tables so a fix names only what it changes."""
    merged = dict(base)
    for key, value in fix.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def derive_for_model_type(model_type: str, data: DerivedData, transformers_version: str | None = None) -> Derivation:
    """Class defaults of `model_type` -> tiny overrides (plus its fix from derived.toml); its skips from
    derived.toml are asked at `transformers_version` (default: the installed release)."""

    reason = data.skip_reason(model_type, transformers_version or transformers.__version__)
    if reason:
        raise NotDerivable(reason)

    try:
        config = AutoConfig.for_model(model_type)
    except Exception as error:
        raise NotDerivable(
            f"the config class cannot be built from its defaults: {type(error).__name__}: "
            f"{str(error).splitlines()[0][:200]}"
        ) from None
    derivation = derive_tiny(config)
    fix = data.fixes.get(model_type, {})
    if fix:
        return Derivation(_merge(derivation.tiny, fix), f"{derivation.why}; fixed in derived.toml: {', '.join(fix)}")
    return derivation


def derived_entries(registry: dict[str, ModelEntry], data: DerivedData | None = None) -> dict[str, ModelEntry]:
    """An entry per causal-LM architecture the registry does not cover; unbuildable ones carry a skip_reason.
    Names are the model_type ('-' -> '_'), suffixed `_derived` where a registry entry has that name."""

    data = data or load_derived_data()
    covered = {entry.model_type for entry in registry.values()}
    # Shrinking a config builds intermediate ones whose ids are not fixed yet (bos/eos >= the new vocab):
    # transformers warns about each, a hundred lines of noise before the first cell.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity(logging.ERROR)
    try:
        entries = [
            derived_entry(model_type, registry, data)
            for model_type in causal_lm_model_types()
            if model_type not in covered
        ]
    finally:
        hf_logging.set_verbosity(verbosity)
    return {entry.name: entry for entry in entries}


def derived_entry(model_type: str, registry: dict[str, ModelEntry], data: DerivedData) -> ModelEntry:
    """The entry of one architecture (named apart from the registry's). The derivation step's guard: an architecture
    that cannot be built tiny, or whose config a reader cannot read, is a named skip; a harness exception for it
    (a bug) fails its cells as `setup` (ExpansionError); the other architectures are derived either way."""
    name = entry_name(model_type)
    name = f"{name}_derived" if name in registry else name
    try:
        derivation = derive_for_model_type(model_type, data)
    except NotDerivable as reason:
        return ModelEntry(name=name, model_type=model_type, tiny={}, skip_reason=f"{model_type}: {reason}")
    except UnreadableConfig as error:
        return ModelEntry(name, model_type, tiny={}, skip_reason=f"{model_type}: {UNREADABLE_CONFIG}: {error}")
    except Exception as error:  # a harness bug, reported on this architecture's cells as `setup`
        return ModelEntry(name, model_type, tiny={}, expansion_error=ExpansionError.of("derive", error))
    return ModelEntry(
        name=name,
        model_type=model_type,
        tiny=derivation.tiny,
        tiny_why=derivation.why,
        probe_skips=data.probe_skips.get(model_type, {}),
        defaults_layers=_fixed_layers(derivation.tiny, data.fixes.get(model_type, {})),
    )


def _fixed_layers(tiny: dict[str, Any], fix: dict[str, Any]) -> dict[str, Any]:
    """The layer fields of `tiny` where derived.toml's `fix` sets one (the class defaults lack a layer kind the
    checkpoints have): all of them, as the fix's lists were written for the tiny layer count and its other layer
    fields (lfm2_moe's conv | full_attention over num_dense_layers 1); none where the fix sets no layer field."""
    if not any(key in LAYER_FIELDS for key in fix):
        return {}
    return {key: value for key, value in tiny.items() if key in LAYER_FIELDS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--registry",
        action="store_true",
        help="also derive the registry's architectures from their class defaults (a wider test of the rules)",
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    entries = listed_entries(args.registry)
    skipped = {n: e.skip_reason for n, e in entries.items() if e.skip_reason}
    failed = {n: e.expansion_error.describe() for n, e in entries.items() if e.expansion_error}
    print(
        f"{len(causal_lm_model_types())} causal-LM architectures; {len(entries)} "
        f"{'in all' if args.registry else 'not in the registry'}: "
        f"{len(entries) - len(skipped) - len(failed)} derived, {len(skipped)} skipped, {len(failed)} failed (harness "
        f"bugs)"
    )
    for name, reason in sorted(skipped.items()):
        print(f"  skip {name}: {reason}")
    for name, reason in sorted(failed.items()):
        print(f"  setup {name}: {reason}")
    return 1 if failed else 0


def listed_entries(whole_registry: bool) -> dict[str, ModelEntry]:
    """The derived entries, quietly: every architecture when `whole_registry`, else those the registry lacks."""

    hf_logging.set_verbosity(logging.ERROR)
    return derived_entries({} if whole_registry else load_models())


if __name__ == "__main__":
    raise SystemExit(main())
