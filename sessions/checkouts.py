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

import json
import subprocess
from pathlib import Path

from sessions.installers import run_checked

CHECKOUT_LINK = "autotp-checkout.pth"
REQUIREMENTS = Path("requirements") / "requirements.txt"


def requirements_of(src: Path) -> list[str]:
    """The requirement lines of DeepSpeed's requirements file (comments and blanks dropped)."""
    return [line.split("#")[0].strip() for line in (src / REQUIREMENTS).read_text().splitlines()
            if line.split("#")[0].strip()]


def torch_of(python: Path, env: dict[str, str]) -> tuple[str, str]:
    """(accelerator DeepSpeed would record, torch's major.minor) of the torch this python sees."""
    printed = run_checked([str(python), "-c", "import torch; print('cpu' if torch.version.cuda is None and "
                           "not getattr(torch.version, 'hip', None) else 'cuda'); print(torch.__version__)"],
                          "read the layer's torch", env).split()
    accelerator, version = printed[-2], printed[-1]
    return accelerator, ".".join(version.split("+")[0].split(".")[:2])


def prepare_deepspeed_checkout(src: Path, clone: Path, sha: str, site_packages: Path, python: Path,
                               env: dict[str, str]) -> str:
    """Write what DeepSpeed's setup.py would generate for the checkout at src; returns its version."""
    short = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           check=True).stdout.strip()
    version = f"{(src / 'version.txt').read_text().strip()}+{short}"
    accelerator, torch = torch_of(python, env)
    torch_info = {"version": torch, "bf16_support": False, "cuda_version": "0.0", "nccl_version": "0.0",
                  "hip_version": "0.0"}
    (src / "deepspeed" / "git_version_info_installed.py").write_text(
        f"version='{version}'\ngit_hash='{short}'\ngit_branch='HEAD'\ninstalled_ops={{}}\n"
        f"accelerator_name='{accelerator}'\ntorch_info={torch_info}\n")
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
