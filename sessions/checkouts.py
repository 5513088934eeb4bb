"""A DeepSpeed or transformers commit as its own source tree on a layer's path, not a wheel built from it.

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

transformers runs from its `src/` folder as it is (its generated `dependency_versions_table.py` is
committed). At checkout this writes a `transformers-<version>.dist-info` as for DeepSpeed, its version and
requirements as its setup.py passes them to `setup()` (sessions/setup_metadata_probe.py runs it with a
stand-in setuptools: nothing is built; a checkout without setup.py gives them in pyproject.toml's
`[project]`), and `autotp-checkout.pth` naming `src/`. Its requirements are installed into the same layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import tomllib

from matrix.installed import module_constants
from sessions.installers import InstallError, run_checked
from suites.base.git import git_output

CHECKOUT_LINK = "autotp-checkout.pth"
REQUIREMENTS = Path("requirements") / "requirements.txt"
SETUP_PROBE = Path(__file__).with_name("setup_metadata_probe.py")


def requirements_of(src: Path) -> list[str]:
    """The requirement lines of DeepSpeed's requirements file (comments and blanks dropped)."""
    return [
        line.split("#")[0].strip()
        for line in (src / REQUIREMENTS).read_text().splitlines()
        if line.split("#")[0].strip()
    ]


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


def torch_of(paths: list[str]) -> TorchBuild:
    """The torch the first of these site-packages folders that holds one has; InstallError when none does."""
    for folder in paths:
        version_file = Path(folder) / "torch" / "version.py"
        if version_file.is_file():
            constants = module_constants(version_file)
            return TorchBuild(
                str(constants["__version__"]), _text_or_none(constants.get("cuda")), _text_or_none(constants.get("hip"))
            )
    raise InstallError(
        f"no torch/version.py in the layers below ({', '.join(paths)}): the torch layer is incomplete; "
        "remove it to have it built again"
    )


def _text_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def prepare_deepspeed_checkout(src: Path, clone: Path, sha: str, site_packages: Path, lower: list[str]) -> str:
    """Write what DeepSpeed's setup.py would generate for the checkout at src; returns its version."""
    short = git_output("rev-parse", "--short", "HEAD", folder=src).strip()
    version = f"{(src / 'version.txt').read_text().strip()}+{short}"
    torch = torch_of(lower)
    torch_info = {
        "version": torch.minor,
        "bf16_support": False,
        "cuda_version": "0.0",
        "nccl_version": "0.0",
        "hip_version": "0.0",
    }
    (src / "deepspeed" / "git_version_info_installed.py").write_text(
        f"version='{version}'\ngit_hash='{short}'\ngit_branch='HEAD'\ninstalled_ops={{}}\n"
        f"accelerator_name='{torch.accelerator}'\ntorch_info={torch_info}\n"
    )
    write_distribution(
        site_packages, "deepspeed", version=version, requirements=requirements_of(src), clone=clone, sha=sha
    )
    (site_packages / CHECKOUT_LINK).write_text(f"{checkout_path(src, 'deepspeed')}\n")
    return version


def write_distribution(
    site_packages: Path, name: str, *, version: str, requirements: list[str], clone: Path, sha: str
) -> None:
    """The `<name>-<version>.dist-info` of a checkout: what `importlib.metadata` reports, its requirements,
    and PEP 610's `direct_url.json` naming the clone and commit."""
    info = site_packages / f"{name}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {line}\n" for line in requirements)
    )
    (info / "INSTALLER").write_text("autotp-matrix\n")
    (info / "direct_url.json").write_text(
        json.dumps({"url": clone.resolve().as_uri(), "vcs_info": {"vcs": "git", "commit_id": sha}})
    )
    (info / "RECORD").write_text("")


def project_metadata(src: Path, python: Path, env: dict[str, str]) -> tuple[str, list[str]]:
    """(version, requirements) of the source tree at src: pyproject.toml's static `[project]` when it has
    one, else what its setup.py passes to setup()."""
    pyproject = src / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text()).get("project", {}) if pyproject.is_file() else {}
    if not (src / "setup.py").is_file() or ("version" in project and "dependencies" in project):
        if "version" not in project or "dependencies" not in project:
            raise InstallError(
                f"{src}: neither a setup.py nor a pyproject.toml [project] with a static version and "
                "dependencies; cannot put this checkout on the path without building it"
            )
        return str(project["version"]), [str(line) for line in project["dependencies"]]
    printed = run_checked(
        [str(python), str(SETUP_PROBE)], f"read {src / 'setup.py'}'s requirements", {**env, "PYTHONPATH": ""}, cwd=src
    )
    recorded = json.loads(printed.splitlines()[-1])
    if not recorded["version"]:
        raise InstallError(f"{src / 'setup.py'}: setup() was given no version")
    return str(recorded["version"]), list(recorded["install_requires"])


def prepare_transformers_checkout(
    src: Path, *, clone: Path, sha: str, site_packages: Path, python: Path, env: dict[str, str]
) -> tuple[str, list[str]]:
    """Put the transformers checkout at src on the layer's path with its metadata; returns (version,
    requirements): the requirements are the layer's to install."""
    version, requirements = project_metadata(src, python, env)
    write_distribution(site_packages, "transformers", version=version, requirements=requirements, clone=clone, sha=sha)
    (site_packages / CHECKOUT_LINK).write_text(f"{checkout_path(src, 'transformers')}\n")
    return version, requirements


def checkout_path(src: Path, package: str) -> Path:
    """The folder of a checkout that goes on the path: transformers' `src/`, DeepSpeed's top."""
    return src / "src" if package == "transformers" else src
