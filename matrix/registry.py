"""The models registry, as data in `matrix/models.toml`, and what every registry file shares (reading a TOML file of
matrix/, its `[<kind>.<name>]` tables, `pick` by name or tag); the variants are matrix/variants.py's, the failures
known upstream matrix/known_failures.py's.

Each entry becomes one frozen dataclass; every field is documented on the class. A malformed
entry raises `RegistryError` naming the file, the entry and the field, so adding a model never
needs code and a typo never turns into a silent skip.
"""

from __future__ import annotations

import copy
import difflib
import functools
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, get_args

import tomllib
from packaging.version import InvalidVersion, Version

from matrix.config_values import ExpansionError
from matrix.toml_tables import NOT_IN_FILE, Table, TableError, read_table

MATRIX_DIR = Path(__file__).resolve().parent
MODELS_FILE = MATRIX_DIR / "models.toml"

DType = Literal["fp32", "bf16", "fp16"]
"""A cell's dtype, by the name cells, results and the command line spell it."""
DTYPES: tuple[DType, ...] = get_args(DType)


class RegistryError(ValueError):
    """A registry file or a name given on the command line is wrong; the message says how."""


EPSILON: dict[DType, float] = {"fp32": 2.0**-23, "bf16": 2.0**-7, "fp16": 2.0**-10}
"""One unit in the last place of a value of magnitude 1 in each dtype (torch.finfo(dtype).eps): the unit every
bound below is counted in, at the scale of the values it compares."""


def ulps(dtype: DType, count: float) -> float:
    """`count` units in the last place of `dtype`, as a share of the compared values' scale."""
    return count * EPSILON[dtype]


@dataclass(frozen=True)
class Tolerance:
    """How far the sharded model may drift from the unsharded one, per dtype. Every bound is a share of the scale
    of what it compares (the largest reference magnitude), set from the noise measured in correct runs
    (`python benchmarks/noise.py`; figures in docs/findings.md): inference and training apart, each at most 10x its
    largest measured noise and at least a few ulps of the dtype."""

    logits_rel: float
    """Inference: prefill and decode-step logits, max|dlogit| / max|reference logit|; also the margin below which a
    greedy divergence counts as a near-tie in the reference."""
    ppl_rel: float
    """Inference: |ppl_tp - ppl_ref| / ppl_ref."""
    train_loss_rel: float
    """Training: each step's loss (and a resumed step's), relative to the unsharded loss."""
    train_grad_rel: float
    """Training: each gradient shard of the first step, max|dg| / the gradient's scale (its own largest magnitude, or a
    few ulps at the model's largest gradient: suites/variants/trainee.py SCALE_FLOOR_ULPS)."""
    train_later_grad_rel: float
    """Training: the same for a later step's (and a resumed step's) gradients, taken at weights that already carry
    the earlier updates' noise."""
    train_update_rel: float
    """Training: each weight's change over the steps (and the change a loaded checkpoint holds) against the unsharded
    change, after one ulp of the weight is forgiven; AdamW's in the units of the gradient it normalises (Adam's gain
    rule, suites/variants/training.py); both sides clip by a global gradient norm whose summation order differs."""
    train_weight_rel: float
    """Training round trips: saved and gathered full weights against the unsharded trained weights."""
    quant_token_match: float = 0.75
    """Quantized variants, relaxed check: least share of greedy tokens equal to the fp32 baseline's."""
    quant_ppl_rel: float = 0.02
    """Quantized variants, relaxed check: largest |ppl_quantized_tp - ppl_fp32| / ppl_fp32. Measured
    (torchao int8 weight-only, unsharded, tiny llama/qwen2/mistral): 2e-4..1.3e-3; tiny random models
    sit near ppl = vocab, so a wrong scale there moves it only ~1e-2 and the token check catches it."""


def _half_precision(dtype: DType) -> Tolerance:
    """bf16's measured counts in `dtype`'s own ulps (fp16 takes them, unmeasured: DeepSpeed refuses fp16 on CPUs
    without AVX512-FP16, at every release; from 0.16.8 on those with it)."""
    return Tolerance(
        logits_rel=ulps(dtype, 8),
        ppl_rel=ulps(dtype, 1 / 8),
        train_loss_rel=ulps(dtype, 1 / 16),
        train_grad_rel=ulps(dtype, 4),
        train_later_grad_rel=ulps(dtype, 8),
        train_update_rel=ulps(dtype, 4),
        train_weight_rel=ulps(dtype, 2),
    )


# Each bound is k ulps of the dtype at the compared values' scale, k the smallest power of two at least MARGIN
# times the largest noise measured in correct cells (`python benchmarks/noise.py`: the default matrix in fp32 and
# bf16; the training rows of llama and qwen2, and train, train_zero1, train_universal of llama_large and
# llama.faithful; DeepSpeed 0.19.8, transformers 5.24, torch 2.13, CPU; docs/findings.md "Tolerances at the
# measured noise"), and at least 8 ulps where none was measured. MARGIN is 4 in fp32 (bound / noise 4-8x) and 2 in
# bf16 (2-4x: bf16's noise is already 1-3 of its ulps, a few percent of the scale, where the bug classes of the
# fault tests start). fp16 takes bf16's counts in its own ulps (not measured: fp16 cells are `unsupported` on CPUs
# without AVX512-FP16, the only ones measured; DeepSpeed runs them from 0.16.8 on CPUs with it). No bound is
# more than 10x its noise.
DEFAULT_TOLERANCES: dict[DType, Tolerance] = {
    # largest noise (ulps): logits 9.2, decode steps 8.5, perplexity 3.0; training (llama_large): loss 55 (the step
    # after load_checkpoint), first-step gradients 8.0, later gradients 1008 (the resumed step of train_universal:
    # AdamW's updates' noise amplified), updates 1809 (the clip norm's summation order over 81 M elements; 1593 in
    # AdamW's gradient units, 2026-12-04), saved/gathered weights 13
    "fp32": Tolerance(
        logits_rel=ulps("fp32", 64),
        ppl_rel=ulps("fp32", 16),
        train_loss_rel=ulps("fp32", 256),
        train_grad_rel=ulps("fp32", 64),
        train_later_grad_rel=ulps("fp32", 4096),
        train_update_rel=ulps("fp32", 8192),
        train_weight_rel=ulps("fp32", 64),
    ),
    # largest noise (ulps): logits 2.8, decode steps 2.1, perplexity 0.052; training (llama, qwen2): loss 0.018,
    # gradients (every step) 1.9, the resumed step's 3.0, updates and loaded weights' updates 1.8 (llama_large
    # train_universal, AdamW in gradient units; qwen2.faithful's 5.3 before Adam's gain rule), saved/gathered 0.99
    "bf16": _half_precision("bf16"),
    "fp16": _half_precision("fp16"),
}


SplitRuleSize = Literal["heads", "kv_heads", "experts", "attention_out"]
"""What a split rule may name: counts AutoTP splits whole, and the attention width (heads x head_dim)."""


@dataclass(frozen=True)
class SplitRule:
    """A condition DeepSpeed puts on one size of an architecture at each tp, beyond AutoTP's split by whole heads
    and 64-wide grains (codegen's fused qkv: kv heads % (4 x tp) == 0). A faithful tiny config meets it at a tp
    exactly where the real checkpoint does, so DeepSpeed takes the same path (or refuses) for both."""

    size: SplitRuleSize
    why: str
    """Where DeepSpeed states it (module:function) and what it does."""
    multiple_of_tp_times: int = 0
    """The size must divide by this times tp (0: no such condition)."""
    at_least_tp_times: int = 0
    """The size must be at least this times tp (0: no such condition)."""
    equals: Literal["", "hidden"] = ""
    """Another size the size must equal (`hidden`: DeepSpeed computes head_dim as hidden // heads)."""

    def validate(self) -> None:
        """The conditions a rule in models.toml may state (toml_tables.read_table)."""
        for key in ("multiple_of_tp_times", "at_least_tp_times"):
            if getattr(self, key) < 0:
                raise TableError(key, f"must be an integer >= 0, got {getattr(self, key)!r}")
        if self.equals and self.size != "attention_out":
            raise TableError("equals", f"must be 'hidden', for size 'attention_out', got size {self.size!r}")
        if self.size == "attention_out" and (self.multiple_of_tp_times or self.at_least_tp_times):
            raise TableError(
                "", "multiple_of_tp_times and at_least_tp_times apply to counts (heads, kv_heads, experts)"
            )
        if not (self.multiple_of_tp_times or self.at_least_tp_times or self.equals):
            raise TableError("", "states no condition (multiple_of_tp_times, at_least_tp_times or equals)")

    def conditions(self, sizes: dict[str, int], tp: int) -> dict[str, bool]:
        """Each condition at `tp`, named as a pattern entry (`kv_heads % 4tp`), true where `sizes` meet it."""
        value = sizes[self.size]
        found = {}
        if self.multiple_of_tp_times:
            found[f"{self.size} % {self.multiple_of_tp_times}tp"] = value % (self.multiple_of_tp_times * tp) == 0
        if self.at_least_tp_times:
            found[f"{self.size} >= {self.at_least_tp_times}tp"] = value >= self.at_least_tp_times * tp
        if self.equals:
            found[f"{self.size} = {self.equals}"] = value == sizes[self.equals]
        return found


SKIPPABLE_PROBES = ("perplexity",)
"""Probes an architecture may declare it cannot run (ModelEntry.probe_skips): the `labels=` loss over the corpus."""


@dataclass(frozen=True)
class ModelEntry:
    """One architecture the matrix tests."""

    name: str
    """Short name used on the command line and in cell ids (the TOML table key)."""
    model_type: str
    """transformers `model_type`, used with `AutoConfig.for_model` to build the tiny checkpoint."""
    tiny: dict[str, Any]
    """Config overrides for the tiny random checkpoint (every value valid for the architecture)."""
    tiny_why: str = ""
    """Why the tiny dims are what they are (which sharding case they exercise)."""
    hub_ids: tuple[str, ...] = ()
    """Real checkpoints for GPU runners, loaded through the normal HF cache (`HF_HOME`)."""
    revisions: dict[str, str] = field(default_factory=dict, hash=False)
    """Pinned commit (40 hex digits) per hub id: `--checkpoints hub` and `nox -s prefetch` load exactly
    that snapshot, so a later run tests the same weights. A hub id without one loads the repository's
    current `main`; either way a cell's record names the commit it loaded (`checkpoint.revision`)."""
    min_transformers: str | None = None
    """Oldest transformers that has this architecture; older versions skip with a reason."""
    max_transformers: str | None = None
    """Newest transformers this entry applies to (inclusive); newer versions skip with a reason."""
    trust_remote_code: bool = False
    """The architecture needs remote code; refused unless the run passes --allow-remote-code."""
    known_issues: tuple[str, ...] = ()
    """Links to known AutoTP issues for this model, shown next to failing cells."""
    tolerance: dict[DType, Tolerance] = field(default_factory=dict)
    """Per-dtype tolerance overrides; dtypes not named here use DEFAULT_TOLERANCES."""
    skip_reason: str | None = None
    """Why this architecture cannot be tested at all (e.g. it cannot be built tiny); its cells skip with it."""
    split_rules: tuple[SplitRule, ...] = ()
    """Architecture-specific split conditions of DeepSpeed that faithful tiny configs keep (matrix/shapes/)."""
    checkpoints: tuple[str, ...] = field(default=(), metadata=NOT_IN_FILE)
    """The hub ids a faithful cell's verdict stands for: those whose recorded sizes split like the cell's tiny
    config at every tp (matrix/shapes/); empty for stress cells and for faithful cells of config-class defaults."""
    expansion_error: ExpansionError | None = field(default=None, metadata=NOT_IN_FILE)
    """A harness exception in a step of expanding this architecture before its cells ran (matrix/config_values.py):
    its cells fail as `setup` naming it, the other architectures' cells run. Never set in models.toml."""
    probe_skips: dict[str, str] = field(default_factory=dict, hash=False)
    """Probes that cannot run on this architecture (a key of SKIPPABLE_PROBES) -> why: the other probes run, and the
    check of a skipped one passes naming its reason (an image-to-text model's text-only `labels=` loss)."""
    family: str = ""
    """The family as DeepSpeed's automatic-tensor-parallelism page names it (`gpt-neox`, `qwen2-moe`, `openai`),
    where that differs from `model_type`; the supported-models page and its diff list the entry under it."""
    defaults_layers: dict[str, Any] = field(default_factory=dict, hash=False, metadata=NOT_IN_FILE)
    """A derived architecture's layer fields that derived.toml's fix sets because the config class defaults lack a
    layer kind its checkpoints have (granitemoehybrid's defaults: every layer mamba): its faithful record reads the
    class defaults with these, so the faithful rule keeps that kind. Never set in models.toml."""

    @property
    def docs_family(self) -> str:
        """The family DeepSpeed's page lists this entry under: `family`, else the model_type."""
        return self.family or self.model_type

    def tolerance_for(self, dtype: DType) -> Tolerance:
        return self.tolerance.get(dtype, DEFAULT_TOLERANCES[dtype])

    def validate(self) -> None:
        """models.toml's rules beyond the fields' types (toml_tables.read_table)."""
        for key in ("min_transformers", "max_transformers"):
            version = getattr(self, key)
            if version is not None and not is_version(version):
                raise TableError(key, f"is not a version: {version!r}")
        for probe, reason in self.probe_skips.items():
            if probe not in SKIPPABLE_PROBES or not reason.strip():
                raise TableError(
                    f"probe_skips.{probe}", f"must name one of {list(SKIPPABLE_PROBES)} with a reason, got {reason!r}"
                )
        for hub_id, revision in self.revisions.items():
            if hub_id not in self.hub_ids:
                raise TableError("revisions", f"pins {hub_id!r}, which is not in hub_ids {list(self.hub_ids)}")
            if not COMMIT_SHA.fullmatch(revision):
                raise TableError(
                    f'revisions."{hub_id}"',
                    f"must be a full commit sha (40 lowercase hex digits; a branch or tag moves), got {revision!r}",
                )

    def version_skip_reason(self, transformers_version: str) -> str | None:
        """Why this entry cannot run at the installed transformers (`transformers_version`): a declared
        version gate, or an architecture that release does not have (asked of the installed package,
        so a new architecture needs no gate of its own)."""
        installed = Version(transformers_version)
        if self.min_transformers and installed < Version(self.min_transformers):
            return f"{self.name} needs transformers >= {self.min_transformers} (installed {installed})"
        if self.max_transformers and installed > Version(self.max_transformers):
            return f"{self.name} is registered up to transformers {self.max_transformers} (installed {installed})"
        if not self.trust_remote_code and not has_causal_lm(self.model_type):
            return f"{self.name}: transformers {installed} has no causal-LM model of type {self.model_type!r}"
        return None


def has_causal_lm(model_type: str) -> bool:
    """Whether the installed transformers has an `AutoModelForCausalLM` class for `model_type`
    (architectures are added release by release: gemma2 in 4.42, qwen3 in 4.51, ...)."""
    # lazily: nox's own process imports this module, with only nox installed (README)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def read_toml(path: Path, missing_hint: str = "") -> dict[str, Any]:
    """A data file of matrix/ as a dict (the caller's own copy); a RegistryError naming the file (and
    `missing_hint`) otherwise. Parsed once per content of the file: a render reads models.toml ~70 times."""
    return copy.deepcopy(_parsed_toml(path, _file_text(path, missing_hint)))


def _file_text(path: Path, missing_hint: str = "") -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise RegistryError(f"{path}: file not found{missing_hint}") from None


@functools.cache
def _parsed_toml(path: Path, text: str) -> dict[str, Any]:
    """Keyed by the file's whole text, not its modification time: a file written twice within the clock's
    granularity (a test, an editor) is never read as its earlier content."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise RegistryError(f"{path}: not valid TOML: {error}") from None


ParsedFile = TypeVar("ParsedFile")


def parsed_once(path: Path, parse: Callable[[Path], ParsedFile], missing_hint: str = "") -> ParsedFile:
    """`parse(path)` computed once per content of the file (and per `parse`): the registry's records are frozen
    dataclasses, and a render reads the same file's records hundreds of times (each repro script and draft expands
    its cells again). A changed file is parsed again, one that changed while it was parsed is not kept, and an error
    is raised every time."""
    text = _file_text(path, missing_hint)
    key = (parse, path, text)
    if key not in _PARSED_FILES:
        parsed = parse(path)
        if _file_text(path, missing_hint) != text:
            return parsed
        _PARSED_FILES[key] = parsed
    return cast(ParsedFile, _PARSED_FILES[key])


_PARSED_FILES: dict[tuple[Callable[[Path], Any], Path, str], Any] = {}


COMMIT_SHA = re.compile(r"[0-9a-f]{40}")


def is_version(text: str) -> bool:
    """Whether `text` is a PEP 440 version."""
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def read_entry(
    cls: type[Table], path: Path, kind: str, name: str, raw: object, rules: Callable[[Table], None] | None = None
) -> Table:
    """The [<kind>.<name>] table of a registry file as a `cls` named `name`."""
    where = f"{path}: entry [{kind}.{name}]"
    return read_table(cls, raw, where=where, error=RegistryError, given={"name": name}, rules=rules)


def _with_default_bounds(raw: object) -> object:
    """A model's tolerance table for a dtype names only the bounds it changes: the others are the dtype's
    DEFAULT_TOLERANCES."""
    if not isinstance(raw, dict) or not isinstance(raw.get("tolerance"), dict):
        return raw
    tolerance = {
        dtype: {**asdict(DEFAULT_TOLERANCES[dtype]), **bounds}
        if dtype in DEFAULT_TOLERANCES and isinstance(bounds, dict)
        else bounds
        for dtype, bounds in raw["tolerance"].items()
    }
    return {**raw, "tolerance": tolerance}


def parse_model(path: Path, name: str, raw: object) -> ModelEntry:
    return read_entry(ModelEntry, path, "models", name, _with_default_bounds(raw))


def _check_name(path: Path, kind: str, name: str) -> None:
    if not name.replace("_", "").isalnum() or not name.islower():
        raise RegistryError(
            f"{path}: entry [{kind}.{name}] name must be lowercase letters, digits and '_' (it is used in cell ids)"
        )


def load_tables(path: Path, kind: str, parse: Callable[[Path, str, object], Table]) -> dict[str, Table]:
    tables = read_toml(path).get(kind)
    if not isinstance(tables, dict) or not tables:
        raise RegistryError(f"{path}: no [{kind}.<name>] tables found")
    for name in tables:
        _check_name(path, kind, name)
    return {name: parse(path, name, raw) for name, raw in tables.items()}


def load_models(path: Path = MODELS_FILE) -> dict[str, ModelEntry]:
    """The registry's entries (the caller's own dict of shared frozen entries), parsed once per content of the file."""
    return dict(parsed_once(path, _parsed_models))


def _parsed_models(path: Path) -> dict[str, ModelEntry]:
    return load_tables(path, "models", parse_model)


def load_popularity(path: Path = MODELS_FILE) -> tuple[str, ...]:
    """The registry's hub ids by how much users run them, most first (models.toml's top-level `popularity`): a
    cause's example cell is the one standing for the most-run checkpoint. Every name must be a hub id of an entry;
    hub ids it leaves out rank after it, in registry order."""
    raw = read_toml(path).get("popularity", [])
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise RegistryError(f"{path}: 'popularity' must be a list of hub ids (most-run first), got {raw!r}")
    known = {hub_id for entry in load_models(path).values() for hub_id in entry.hub_ids}
    unknown = [hub_id for hub_id in raw if hub_id not in known]
    if unknown:
        raise RegistryError(
            f"{path}: 'popularity' names hub ids no [models.<name>] entry lists: {', '.join(unknown)}; "
            "add them to an entry's hub_ids or remove them"
        )
    duplicated = sorted({hub_id for hub_id in raw if raw.count(hub_id) > 1})
    if duplicated:
        raise RegistryError(f"{path}: 'popularity' names {', '.join(duplicated)} more than once")
    return tuple(raw)


def pick(registry: dict[str, Any], names: list[str], kind: str) -> list[Any]:
    """The entries named, in the order given; `all` means every entry, a tag (Variant.tags) every entry
    carrying it. Unknown names list close ones."""
    if names == ["all"]:
        return list(registry.values())
    tags = {
        tag: [entry for entry in registry.values() if tag in entry.tags]
        for entry in registry.values()
        for tag in getattr(entry, "tags", ())
    }
    picked: dict[str, Any] = {}
    for name in names:
        if name not in registry and name not in tags:
            close = difflib.get_close_matches(name, [*registry, *tags], n=5, cutoff=0.5)
            hint = (
                f"did you mean: {', '.join(close)}?"
                if close
                else f"known {kind}s: {', '.join(sorted([*registry, *tags]))}"
            )
            raise RegistryError(f"unknown {kind} {name!r}; {hint}")
        for entry in [registry[name]] if name in registry else tags[name]:
            picked.setdefault(entry.name, entry)
    return list(picked.values())
