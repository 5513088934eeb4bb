"""A DeepSpeed commit as its own source tree on a layer's path, not a wheel built from it.

DeepSpeed's repository runs from a checkout (`deepspeed/ops/csrc` and `deepspeed/ops/op_builder` are links
into the tree) once the files its setup.py would generate are there. At checkout this writes them as
setup.py writes them for a source install without prebuilt ops:

- `deepspeed/git_version_info_installed.py`: version (`version.txt` + `+<short hash>`), git hash and
  branch, no op installed, the accelerator and torch version of the layer's torch;
- a `deepspeed-<version>.dist-info` in the layer's site-packages: the version `importlib.metadata` reports,
  its requirements, and PEP 610's `direct_url.json` naming the clone and commit (what the run records read
  as `deepspeed_git`, and what an upper layer's resolution leaves alone);
- `autotp-checkout.pth`: the checkout on the layer's path.

The dependencies come from the checkout's `requirements/requirements.txt`, installed like any layer's.
"""

from __future__ import annotations

import ast
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sessions.installers import InstallError

CHECKOUT_LINK = "autotp-checkout.pth"
REQUIREMENTS = Path("requirements") / "requirements.txt"


def requirements_of(src: Path) -> list[str]:
    """The requirement lines of DeepSpeed's requirements file (comments and blanks dropped)."""
    return [line.split("#")[0].strip() for line in (src / REQUIREMENTS).read_text().splitlines()
            if line.split("#")[0].strip()]


@dataclass(frozen=True)
class TorchBuild:
    """What a layer's torch was built as, read from its `torch/version.py` (no import: importing torch costs
    seconds, tens of seconds on a loaded machine)."""

    version: str
    """torch.__version__: `2.13.0+cpu`."""
    cuda: str | None
    hip: str | None

    @property
    def accelerator(self) -> str:
        """The accelerator DeepSpeed's setup.py records for this torch: cpu unless torch was built for CUDA or ROCm."""
        return "cpu" if self.cuda is None and self.hip is None else "cuda"

    @property
    def minor(self) -> str:
        """major.minor, as DeepSpeed's torch_info records it."""
        return ".".join(self.version.split("+")[0].split(".")[:2])


def module_constants(file: Path) -> dict[str, object]:
    """The module-level `NAME = <literal>` assignments of a python file, read without running it."""
    found: dict[str, object] = {}
    for node in ast.parse(file.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Name) and node.value is not None:
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return found


def torch_of(paths: list[str]) -> TorchBuild:
    """The torch the first of these site-packages folders that holds one has; InstallError when none does."""
    for folder in paths:
        version_file = Path(folder) / "torch" / "version.py"
        if version_file.is_file():
            constants = module_constants(version_file)
            return TorchBuild(str(constants["__version__"]), _text_or_none(constants.get("cuda")),
                              _text_or_none(constants.get("hip")))
    raise InstallError(f"no torch/version.py in the layers below ({', '.join(paths)}): the torch layer is incomplete; "
                       "remove it to have it built again")


def _text_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def prepare_deepspeed_checkout(src: Path, clone: Path, sha: str, site_packages: Path, lower: list[str]) -> str:
    """Write what DeepSpeed's setup.py would generate for the checkout at src; returns its version."""
    short = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           check=True).stdout.strip()
    version = f"{(src / 'version.txt').read_text().strip()}+{short}"
    torch = torch_of(lower)
    torch_info = {"version": torch.minor, "bf16_support": False, "cuda_version": "0.0", "nccl_version": "0.0",
                  "hip_version": "0.0"}
    (src / "deepspeed" / "git_version_info_installed.py").write_text(
        f"version='{version}'\ngit_hash='{short}'\ngit_branch='HEAD'\ninstalled_ops={{}}\n"
        f"accelerator_name='{torch.accelerator}'\ntorch_info={torch_info}\n")
    info = site_packages / f"deepspeed-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: deepspeed\nVersion: {version}\n"
                                   + "".join(f"Requires-Dist: {line}\n" for line in requirements_of(src)))
    (info / "INSTALLER").write_text("autotp-matrix\n")
    (info / "direct_url.json").write_text(json.dumps({"url": clone.resolve().as_uri(),
                                                      "vcs_info": {"vcs": "git", "commit_id": sha}}))
    (info / "RECORD").write_text("")
    (site_packages / CHECKOUT_LINK).write_text(f"{src}\n")
    return version
