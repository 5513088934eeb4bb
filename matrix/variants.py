"""The variants registry, as data in `matrix/variants.toml`: one way of running a model under AutoTP each (how it is
loaded, quantized, trained). Each row becomes a frozen `Variant`; every field is documented on the class. A malformed
row raises `RegistryError` naming the file, the row and the field."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from matrix.registry import MATRIX_DIR, load_tables, parsed_once, read_entry
from matrix.toml_tables import TableError

VARIANTS_FILE = MATRIX_DIR / "variants.toml"

LoadMode = Literal["eager", "meta"]
CheckpointFormat = Literal["safetensors", "bin"]
Quantization = Literal["", "deepspeed_int8", "deepspeed_int4", "torchao_int8"]
Partitioning = Literal["auto", "heuristics", "tp_plan", "preset", "custom"]


@dataclass(frozen=True)
class Variant:
    """One way of running a model under AutoTP (how it is loaded, quantized, trained)."""

    name: str
    """Short name used in cell ids (the TOML table key)."""
    load: LoadMode = "eager"
    """`eager`: full model loaded on every rank with `from_pretrained`, then sharded; `meta`: built
    with `from_config` under `deepspeed.OnDevice(device="meta")` and filled shard by shard from the
    checkpoint files by `init_inference(checkpoint=<checkpoints json>)`."""
    checkpoint_format: CheckpointFormat = "safetensors"
    """Files the `meta` loader reads: `safetensors` (as saved) or `bin` (a torch.save copy)."""
    checkpoint_files: int = 1
    """`meta` only: split the checkpoint into this many weight files. DeepSpeed reads each file whole
    on every rank, so only a multi-file checkpoint (like real ones) can load in less than a full copy."""
    keep_module_on_host: bool = False
    """Pass `keep_module_on_host=True` to `init_inference` (weights stay in host memory); releases
    whose inference config lacks the field skip the cell with a reason."""
    quantization: Quantization = ""
    """Weight-only quantization: `deepspeed_int8`/`deepspeed_int4` (DeepSpeed's group-wise post-init
    quantization, applied to each rank's shard after init_inference), `torchao_int8` (HF
    `TorchAoConfig` int8 weight-only, applied by `from_pretrained` before AutoTP), or empty."""
    quant_group_size: int = 32
    """Group size of DeepSpeed's group-wise quantization (along the input dimension)."""
    training: bool = False
    """AutoTP training (`deepspeed.initialize` with `tensor_parallel.autotp_size`) instead of inference:
    loss, each rank's gradient shard and weight update against the same steps on the unsharded model."""
    training_steps: int = 1
    """Training only: optimizer steps before the model is judged; from 2 on, a step runs on weights and
    optimizer state the sharded engine updated itself."""
    optimizer: Literal["sgd", "adam"] = "sgd"
    """Training only: `sgd` (with momentum) or `adam` (AdamW; universal checkpoint conversion reads
    Adam's exp_avg/exp_avg_sq and refuses other optimizer states)."""
    partitioning: Partitioning = "auto"
    """Training only: what decides the sharding. `auto`: whatever DeepSpeed picks for the model as
    shipped (partition_config > the model's HF tp_plan > name heuristics); `heuristics`: the model's
    tp_plan hidden, so AutoTP's name heuristics decide; `tp_plan`: the model's HF tp_plan (models
    without one skip); `preset`: `tensor_parallel.preset_model` = the model's model_type (types without
    a DeepSpeed preset skip); `custom`: `tensor_parallel.partition_config` = this row's `partition_config`."""
    partition_config: dict[str, Any] = field(default_factory=dict, hash=False)
    """`partitioning = "custom"` only: DeepSpeed's `partition_config` (layer_specs with regex patterns)."""
    zero_stage: Literal[0, 1, 2, 3] = 0
    """Training only: ZeRO stage 0-3 alongside AutoTP."""
    tp_overlap_comm: bool = False
    """Training only: `tensor_parallel.tp_overlap_comm` (overlap the row-parallel all-reduce)."""
    checkpoint_round_trip: bool = False
    """Training only: after the steps, `save_checkpoint` + `save_16bit_model`, gather the full weights
    with `GatherReplacedLayerParams`, load the checkpoint into a fresh engine and take one more step."""
    resume_tp: int = 0
    """Round trip only: load at this tensor-parallel size instead of the cell's, through DeepSpeed's
    universal checkpoint (`ds_to_universal`, then `checkpoint.load_universal`); the rest of the rank
    group's ranks are data-parallel (1: no AutoTP, plain data parallel). Needs ZeRO stage >= 1, whose
    optimizer fragments the conversion reads. 0: the cell's tp, the checkpoint loaded as saved."""
    second_model: str = ""
    """Training only: a registry model (of another shape) sharded and trained in the same process,
    initialised after the cell's model; both are judged."""
    needs: tuple[str, ...] = ()
    """DeepSpeed features the row uses (names in TRAINING_FEATURES); a release without one skips the
    cell naming it. Every feature the row's fields imply must be listed."""
    tags: tuple[str, ...] = ()
    """Selection names: `--variants <tag>` picks every variant carrying it (e.g. `train-all`)."""
    description: str = ""
    """One line for people reading the report."""

    @property
    def unsharded_steps(self) -> int:
        """Training only: the unsharded model's steps a cell compares with: its own, plus the step a
        resumed run takes after the checkpoint round trip."""
        return self.training_steps + self.checkpoint_round_trip

    def implied_features(self) -> set[str]:
        """The DeepSpeed features this row's fields use (see TRAINING_FEATURES)."""
        if not self.training:
            return set()
        implied = {"autotp_training"}
        implied |= {PARTITIONING_FEATURES[self.partitioning]} - {""}
        if self.tp_overlap_comm:
            implied.add("tp_overlap_comm")
        if self.checkpoint_round_trip:
            implied.add("gather_replaced_params")
        if self.resume_tp:
            implied.add("universal_checkpoint")
        return implied

    def validate(self) -> None:
        """variants.toml's rules beyond the fields' types (toml_tables.read_table)."""
        if self.quant_group_size < 2 or self.quant_group_size % 2:
            raise TableError("quant_group_size", "must be an even number >= 2 (int4 packs two values a byte)")
        if self.training and (self.load != "eager" or self.quantization):
            raise TableError(
                "",
                f"combines training with load={self.load!r}/quantization={self.quantization!r}; "
                "training variants load eagerly and unquantized",
            )
        if self.load != "meta" and (self.checkpoint_format != "safetensors" or self.checkpoint_files != 1):
            raise TableError("", "fields 'checkpoint_format'/'checkpoint_files' only apply to load = \"meta\"")
        if self.checkpoint_files < 1:
            raise TableError("checkpoint_files", f"must be >= 1, got {self.checkpoint_files}")
        if self.training:
            self._validate_training()
        elif used := [key for key in TRAINING_ONLY if getattr(self, key) != getattr(UNTRAINED, key)]:
            raise TableError("", f"sets {used} without training = true")

    def _validate_training(self) -> None:
        if (self.partitioning == "custom") != bool(self.partition_config):
            raise TableError("partition_config", 'is needed with partitioning = "custom" and only there')
        if self.resume_tp and (not self.checkpoint_round_trip or self.zero_stage < 1 or self.resume_tp < 0):
            raise TableError(
                "resume_tp",
                "needs checkpoint_round_trip = true and zero_stage >= 1 "
                "(the universal conversion reads ZeRO's optimizer fragments)",
            )
        if self.training_steps < 1:
            raise TableError("training_steps", f"must be >= 1, got {self.training_steps}")
        if unknown := set(self.needs) - set(TRAINING_FEATURES):
            raise TableError("needs", f"has unknown feature(s) {sorted(unknown)}; known: {sorted(TRAINING_FEATURES)}")
        if missing := self.implied_features() - set(self.needs):
            raise TableError("needs", f"must list {sorted(missing)} (the row's fields use them)")


UNTRAINED = Variant(name="untrained")
"""A row's defaults: an inference row leaves every field of TRAINING_ONLY at them."""
TRAINING_ONLY = (
    "training_steps",
    "optimizer",
    "partitioning",
    "partition_config",
    "zero_stage",
    "tp_overlap_comm",
    "checkpoint_round_trip",
    "resume_tp",
    "second_model",
)
PARTITIONING_FEATURES: dict[Partitioning, str] = {
    "auto": "",
    "heuristics": "",
    "tp_plan": "hf_tp_plan",
    "preset": "preset_model",
    "custom": "partition_config",
}
TRAINING_FEATURES = {
    "autotp_training": "AutoTP training (tensor_parallel.autotp_size, deepspeed.module_inject.layers.set_autotp_mode)",
    "hf_tp_plan": "sharding by the model's HF tp_plan (deepspeed.module_inject.tp_plan_converter)",
    "preset_model": "tensor_parallel.preset_model (AutoTP training config field)",
    "partition_config": "tensor_parallel.partition_config (AutoTP training config field)",
    "tp_overlap_comm": "tensor_parallel.tp_overlap_comm (AutoTP training config field)",
    "gather_replaced_params": "deepspeed.module_inject.layers.GatherReplacedLayerParams",
    "universal_checkpoint": "universal checkpoints of AutoTP models (deepspeed.checkpoint.ds_to_universal, "
    "deepspeed.module_inject.layers.collect_autotp_universal_checkpoint_info)",
}
"""Features a training row may need; suites/variants/training.py detects each in the installed DeepSpeed."""


def _parse_variant(path: Path, name: str, raw: object) -> Variant:
    return read_entry(Variant, path, "variants", name, raw)


def load_variants(path: Path = VARIANTS_FILE) -> dict[str, Variant]:
    """The variants (the caller's own dict of shared frozen rows), parsed once per content of the file."""
    return dict(parsed_once(path, _parsed_variants))


def _parsed_variants(path: Path) -> dict[str, Variant]:
    return load_tables(path, "variants", _parse_variant)
