"""Layered environments (sessions/environments.py, sessions/installers.py) on fake packages served from a
local wheel folder (no index): a torch layer, a DeepSpeed layer over it and a combination layer over that.

- An upper install never modifies a lower layer (hash of every file before and after), even when the
  upper layer needs another version of a lower layer's package: it holds its own, which wins.
- torch is never installed again above the torch layer.
- uv and the pip fallback give every layer the same packages (but for pip's own tools in pip's venvs).
- Combinations built at once by threads (`nox -s backfill` builds ahead) over a DeepSpeed layer not built yet
  build it once, and each gets what it would have built alone.
- The uv binary comes from the pin in pyproject.toml; where it cannot be installed the build says so and
  uses pip.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

import sessions.environments as environments
import sessions.installers as installers
from sessions.checkouts import project_metadata
from sessions.environments import BASE_LINK, READY_MARKER, EnvironmentSpec, commit_environment, ensure_environment
from sessions.installers import INSTALLER_ENV, InstallError, installed, sysconfig_purelib, uv_requirement
from tests.fake_packages import FAKE_TORCH_VERSION, fake_comm_op, git, make_repo, pyproject

SEED_TOOLS = {"pip", "setuptools", "wheel"}  # what `python -m venv` puts in every venv of the pip fallback

FAKES = [  # (name, version, requirements)
    ("torch", "2.13.0", ["alpha>=1"]),
    ("alpha", "1.0", []),
    ("alpha", "2.0", []),
    ("beta", "1.0", ["alpha>=1"]),
    ("deepspeed", "0.19.8", ["torch>=2", "beta"]),
    ("gamma", "1.0", []),
    ("transformers", "5.24.0", ["alpha>=2", "gamma"]),
    ("transformers", "5.23.0", ["alpha>=1", "gamma"]),
]


def write_wheel(
    folder: Path, name: str, version: str, requires: list[str], extra: dict[str, str] | None = None
) -> None:
    module = f"VERSION = {version!r}\n" + (
        "from . import version\n__version__ = version.__version__\n"
        "class cuda:\n    is_available = staticmethod(lambda: False)\n"
        if name == "torch"
        else ""
    )
    torch_version = {"torch/version.py": FAKE_TORCH_VERSION.replace("2.13.0", version)} if name == "torch" else {}
    files = {
        f"{name}/__init__.py": module,
        **torch_version,
        **(extra or {}),
        f"{name}-{version}.dist-info/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}\n"
        for path, text in files.items()
    )
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
        wheel.writestr(f"{name}-{version}.dist-info/RECORD", record + f"{name}-{version}.dist-info/RECORD,,\n")


LAUNCHER = {
    "deepspeed/launcher.py": "import sys\n\ndef main():\n    import transformers\n\n"
    "    print(sys.executable, transformers.VERSION)\n",
    "deepspeed-0.19.8.dist-info/entry_points.txt": "[console_scripts]\ndeepspeed = deepspeed.launcher:main\n",
}
"""DeepSpeed's launcher as a console script of the DeepSpeed layer: it reports the python its ranks would run and
whether transformers (a package of the combination's layer) imports there."""


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    for name, version, requires in FAKES:
        write_wheel(folder, name, version, requires, LAUNCHER if name == "deepspeed" else None)
    # A DeepSpeed with op builders the comm-op probe cannot use (no cpu builders; the fake torch has no cuda)
    write_wheel(
        folder,
        "deepspeed",
        "0.19.9",
        ["torch>=2"],
        {"deepspeed/ops/__init__.py": "", "deepspeed/ops/op_builder/__init__.py": ""},
    )
    return folder


@pytest.fixture()
def offline(monkeypatch, wheels):
    """pip (and through it uv) sees only the fake wheel folder."""
    for variable, value in {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_INDEX_URL": "",
        "PIP_CONSTRAINT": "",
    }.items():
        monkeypatch.setenv(variable, value)


def layers() -> EnvironmentSpec:
    # the torch layer holds alpha 1.0, the combination needs alpha>=2
    torch = EnvironmentSpec(key="torch-pt2.13.0", installs=(("torch==2.13.0", "alpha==1.0"),), shared=True)
    deepspeed = EnvironmentSpec(
        key="base-ds0.19.8-pt2.13.0", installs=(("deepspeed==0.19.8", "torch==2.13.0"),), base=torch, shared=True
    )
    return EnvironmentSpec(
        key="ds0.19.8-tf5.24.0-pt2.13.0", installs=(("transformers==5.24.0", "torch==2.13.0"),), base=deepspeed
    )


def tree_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()


def own_packages(root: Path, key: str) -> dict[str, str]:
    return {
        name: version
        for name, version in installed([sysconfig_purelib(root / key / "bin" / "python")]).items()
        if name not in SEED_TOOLS
    }


def build(root: Path, tool: installers.Installer) -> Path:
    """All three layers with this installer; the lower layers' hashes are checked around the combination's
    install."""
    combination = layers()
    ensure_environment(root, combination.base, tool=tool)
    before = {layer.key: tree_hash(root / layer.key) for layer in combination.lower()}
    python = ensure_environment(root, combination, tool=tool)
    assert {layer.key: tree_hash(root / layer.key) for layer in combination.lower()} == before
    return python


@pytest.mark.parametrize("tool", ["uv", "pip"])
def test_layers_hold_only_what_is_below_them_missing_and_never_change_a_lower_layer(tmp_path, uv, offline, tool):
    root = tmp_path / "envs"
    python = build(root, uv if tool == "uv" else installers.Installer(None))

    assert own_packages(root, "torch-pt2.13.0") == {"torch": "2.13.0", "alpha": "1.0"}
    assert own_packages(root, "base-ds0.19.8-pt2.13.0") == {"deepspeed": "0.19.8", "beta": "1.0"}
    # alpha 2.0 for transformers sits in the combination, over the torch layer's 1.0; torch is not installed again
    assert own_packages(root, "ds0.19.8-tf5.24.0-pt2.13.0") == {
        "transformers": "5.24.0",
        "gamma": "1.0",
        "alpha": "2.0",
    }
    link = Path(sysconfig_purelib(python)) / BASE_LINK
    assert link.read_text().splitlines() == [
        sysconfig_purelib(root / key / "bin" / "python") for key in ("base-ds0.19.8-pt2.13.0", "torch-pt2.13.0")
    ]
    seen = subprocess.run(
        [str(python), "-c", "import alpha, beta, torch, deepspeed, transformers; print(alpha.VERSION)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert seen == "2.0"


@pytest.mark.parametrize("tool", ["uv", "pip"])
def test_a_combination_runs_the_deepspeed_launcher_with_its_own_python(tmp_path, uv, offline, tool):
    root = tmp_path / "envs"
    python = build(root, uv if tool == "uv" else installers.Installer(None))
    launcher = python.parent / "deepspeed"

    def launched() -> str:
        return subprocess.run([str(launcher)], capture_output=True, text=True, check=True).stdout.strip()

    # the DeepSpeed layer's own launcher runs its python, which has no transformers: a standalone script died there
    assert (root / "base-ds0.19.8-pt2.13.0" / "bin" / "deepspeed").is_file()
    assert launched() == f"{python} 5.24.0"

    # one built before launchers were given to combinations gets them when it is next ensured, without a rebuild
    launcher.unlink()
    ensure_environment(root, layers(), tool=uv)
    assert launched() == f"{python} 5.24.0"
    # a script of the combination's own is never replaced by a lower layer's
    launcher.write_text(f"#!{python}\nprint('own')\n")
    ensure_environment(root, layers(), tool=uv)
    assert launched() == "own"


def loaded_from_bytecode(python: Path, module: str) -> bool:
    """Whether python, told not to write bytecode (as container images often are), imports module from a .pyc."""
    verbose = subprocess.run(
        [str(python), "-v", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    ).stderr
    return any("code object from" in line and f"/{module}/__pycache__/" in line for line in verbose.splitlines())


def test_torch_and_deepspeed_layers_hold_their_bytecode_and_one_built_before_gets_it_without_a_rebuild(
    tmp_path, uv, offline, monkeypatch
):
    real = environments.release_environment({"deepspeed": "0.19.8", "transformers": "5.24.0", "torch": "2.13.0"})
    assert [layer.shared for layer in (real, *real.lower())] == [False, True, True]  # as layers() has them
    root = tmp_path / "envs"
    python = build(root, uv)
    assert loaded_from_bytecode(python, "torch") and loaded_from_bytecode(python, "deepspeed")
    assert not loaded_from_bytecode(python, "transformers")  # the combination's own layer is left to Python
    assert not list((root / "ds0.19.8-tf5.24.0-pt2.13.0").rglob("*.pyc"))

    # a torch layer built before layers held their bytecode: the next build over it compiles it, installs nothing
    torch_layer = root / "torch-pt2.13.0"
    before = tree_hash(torch_layer)
    (torch_layer / environments.BYTECODE_MARKER).unlink()
    for cache in list(torch_layer.rglob("__pycache__")):
        shutil.rmtree(cache)
    assert not loaded_from_bytecode(python, "torch")
    said: list[str] = []
    ensure_environment(root, layers(), log=said.append, tool=uv)
    assert loaded_from_bytecode(python, "torch")
    assert tree_hash(torch_layer) == before  # the same packages (tree_hash leaves __pycache__ out)
    assert said == [f"compiling the bytecode of {torch_layer} (once: every combination over it imports it)"]

    # a compile that was stopped (compileall killed) leaves no marker: the next ensure compiles again
    monkeypatch.setattr(environments, "COMPILED", ())
    (torch_layer / environments.BYTECODE_MARKER).unlink()
    for _ in range(2):
        ensure_environment(root, layers(), log=said.append, tool=uv)
    assert not (torch_layer / environments.BYTECODE_MARKER).exists() and len(said) == 3


def test_commands_write_the_combinations_bytecode_and_leave_the_shared_layers_byte_for_byte(
    tmp_path, uv, offline, monkeypatch
):
    root = tmp_path / "envs"
    python = build(root, uv)
    shared = ("torch-pt2.13.0", "base-ds0.19.8-pt2.13.0")
    every_file = {key: sorted(path for path in (root / key).rglob("*") if path.is_file()) for key in shared}
    contents = {key: [path.read_bytes() for path in files] for key, files in every_file.items()}
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # as container images often set it

    subprocess.run(
        [str(python), "-c", "import torch, deepspeed, transformers"],
        env=environments.environment_variables(python),
        check=True,
    )
    assert list((root / "ds0.19.8-tf5.24.0-pt2.13.0").rglob("transformers/__pycache__/*.pyc"))
    for key in shared:  # their bytecode was compiled when they were built: nothing is added, nothing rewritten
        assert sorted(path for path in (root / key).rglob("*") if path.is_file()) == every_file[key]
        assert [path.read_bytes() for path in every_file[key]] == contents[key]


def test_uv_and_pip_give_the_same_environment(tmp_path, uv, offline):
    with_uv = build(tmp_path / "uv", uv)
    with_pip = build(tmp_path / "pip", installers.Installer(None))
    for key in ("torch-pt2.13.0", "base-ds0.19.8-pt2.13.0", "ds0.19.8-tf5.24.0-pt2.13.0"):
        assert own_packages(tmp_path / "uv", key) == own_packages(tmp_path / "pip", key)
    assert with_uv.parent.parent.name == with_pip.parent.parent.name


def test_combinations_built_at_once_build_their_shared_layers_once_and_each_its_own_packages(tmp_path, uv, offline):
    root = tmp_path / "envs"
    combinations = {
        version: replace(
            layers(), key=f"ds0.19.8-tf{version}-pt2.13.0", installs=((f"transformers=={version}", "torch==2.13.0"),)
        )
        for version in ("5.24.0", "5.23.0")
    }
    said: list[str] = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        built = list(
            pool.map(lambda spec: ensure_environment(root, spec, log=said.append, tool=uv), combinations.values())
        )

    assert [python.parent.parent.name for python in built] == [spec.key for spec in combinations.values()]
    building = sorted(
        line.split(f"{root}/")[1].split(" ")[0] for line in said if line.startswith("building environment")
    )
    assert building == sorted(
        ["torch-pt2.13.0", "base-ds0.19.8-pt2.13.0", *(spec.key for spec in combinations.values())]
    )
    assert own_packages(root, "ds0.19.8-tf5.24.0-pt2.13.0") == {
        "transformers": "5.24.0",
        "gamma": "1.0",
        "alpha": "2.0",
    }
    assert own_packages(root, "ds0.19.8-tf5.23.0-pt2.13.0") == {"transformers": "5.23.0", "gamma": "1.0"}
    assert own_packages(root, "base-ds0.19.8-pt2.13.0") == {"deepspeed": "0.19.8", "beta": "1.0"}


def test_a_comm_op_that_cannot_be_prebuilt_leaves_the_layer_to_jit_build_it(tmp_path, uv, offline):
    torch = EnvironmentSpec(key="torch-pt2.13.0", installs=(("torch==2.13.0",),))
    layer = EnvironmentSpec(
        key="base-ds0.19.9-pt2.13.0", installs=(("deepspeed==0.19.9", "torch==2.13.0"),), base=torch
    )
    said: list[str] = []
    python = ensure_environment(tmp_path / "envs", layer, log=said.append, tool=uv)
    assert python.exists() and (python.parent.parent / READY_MARKER).exists()
    assert any(
        line.startswith("DeepSpeed's CPU comm op is not prebuilt, the cells JIT-build it: could not describe")
        for line in said
    ), said


def test_pip_s_configuration_is_read_once_per_set_of_pip_variables(monkeypatch):
    listings = []
    real = installers._pip_config_listing
    monkeypatch.setattr(installers, "_pip_config_listing", lambda: listings.append(1) or real())
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels/one")
    assert [installers.pip_configuration()["find-links"] for _ in range(3)] == ["/wheels/one"] * 3
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels/two")
    assert installers.pip_configuration()["find-links"] == "/wheels/two"
    assert len(listings) == 2


def test_uv_that_cannot_be_installed_falls_back_to_pip_and_says_so(tmp_path, offline, monkeypatch):
    monkeypatch.delenv(INSTALLER_ENV, raising=False)
    said = []
    chosen = installers.installer(tmp_path / "envs", log=said.append)  # the fake wheel folder has no uv
    assert chosen.uv is None and chosen.name == "pip"
    assert said and said[0].startswith(f"{uv_requirement()} unavailable, environments are built with pip")


FAKE_DEEPSPEED = {  # what a DeepSpeed checkout needs to run from its tree
    "version.txt": "0.2.0\n",
    "requirements/requirements.txt": "gamma\ntorch>=2.0.0  # torch comes from the torch layer\n",
    "deepspeed/__init__.py": "from .git_version_info_installed import version as __version__, git_hash\n",
    "deepspeed/git_version_info.py": "from .git_version_info_installed import *\n",
    "deepspeed/ops/__init__.py": "",
}


@pytest.mark.parametrize("tool", ["uv", "pip"])
def test_a_deepspeed_commit_is_its_checkout_on_the_path_with_what_setup_py_would_generate(tmp_path, uv, offline, tool):
    clone = tmp_path / "DeepSpeed"
    shas = make_repo(
        clone,
        pyproject("deepspeed"),
        [
            ("Initial", dict(FAKE_DEEPSPEED), "v0.2.0"),
            ("Fix sharding (#4321)", {"deepspeed/shard.py": "FIXED = True\n"}, ""),
        ],
    )
    root = tmp_path / "envs"
    layer = commit_environment(
        root, clone, shas[1], {"deepspeed": "0.2.0", "transformers": "5.24.0", "torch": "2.13.0"}
    ).base
    python = ensure_environment(root, layer, tool=uv if tool == "uv" else installers.Installer(None))

    short = git(clone, "rev-parse", "--short", shas[1])
    shown = json.loads(
        subprocess.run(
            [
                str(python),
                "-c",
                """if True:
        import json, deepspeed, deepspeed.shard
        from importlib import metadata
        from deepspeed.git_version_info_installed import accelerator_name, torch_info
        print(json.dumps({"version": deepspeed.__version__, "metadata": metadata.version("deepspeed"),
                          "hash": deepspeed.git_hash, "file": deepspeed.__file__, "fixed": deepspeed.shard.FIXED,
                          "direct_url": json.loads(metadata.distribution("deepspeed").read_text("direct_url.json")),
                          "accelerator": accelerator_name, "torch": torch_info["version"]}))""",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert shown["version"] == shown["metadata"] == f"0.2.0+{short}" and shown["hash"] == short
    assert shown["file"] == str(root / layer.key / "src" / "deepspeed" / "__init__.py")  # the checkout, not a build
    assert shown["fixed"] is True  # the commit's own tree
    assert shown["direct_url"]["vcs_info"] == {"vcs": "git", "commit_id": shas[1]}
    assert (shown["accelerator"], shown["torch"]) == ("cpu", "2.13")
    assert own_packages(root, layer.key) == {"deepspeed": f"0.2.0+{short}", "gamma": "1.0"}  # its requirements


def commit(repo: Path, subject: str, files: dict[str, str]) -> str:
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "-m", subject)
    return git(repo, "rev-parse", "HEAD")


def test_deepspeed_commits_whose_op_sources_are_unchanged_share_one_build_and_a_changed_csrc_gets_its_own(
    tmp_path, uv, offline, monkeypatch
):
    clone = tmp_path / "DeepSpeed"
    make_repo(clone, pyproject("deepspeed"), [("Initial", {**FAKE_DEEPSPEED, **fake_comm_op()}, "v0.2.0")])
    for link in ("op_builder", "csrc"):  # as in DeepSpeed's tree: deepspeed/ops/{op_builder,csrc} link to the top
        (clone / "deepspeed" / "ops" / link).symlink_to(Path("..") / ".." / link)
    shas = [
        commit(clone, "Links", {}),
        commit(clone, "Fix sharding (#4321)", {"deepspeed/shard.py": "FIXED = True\n"}),
        commit(clone, "Faster shm (#4322)", {"csrc/cpu/comm/shm.h": "int shm; // faster\n"}),
    ]
    monkeypatch.setenv("FAKE_BUILD_LOG", str(tmp_path / "builds.log"))
    root = tmp_path / "envs"
    pins = {"deepspeed": "0.2.0", "transformers": "5.24.0", "torch": "2.13.0"}
    keys, said = [], []
    for sha in shas:
        layer = commit_environment(root, clone, sha, pins).base
        ensure_environment(root, layer, log=said.append, tool=uv)
        library = root / layer.key / "src" / "deepspeed" / "ops" / "comm" / "deepspeed_shm_comm_op.so"
        keys.append(library.resolve().parent.name)
        assert library.resolve() == root / ".ops" / keys[-1] / library.name
    assert keys[0] == keys[1] != keys[2]
    assert (tmp_path / "builds.log").read_text().splitlines() == ["deepspeed_shm_comm_op"] * 2
    assert f"deepspeed.ops.comm.deepspeed_shm_comm_op: reusing the build of key {keys[0]}" in said
    assert not [line for line in said if "described by importing DeepSpeed" in line]  # the files said it all


FAKE_TRANSFORMERS_SETUP = """\
import re
from pathlib import Path

from setuptools import Command, find_packages, setup

_deps = ["alpha>=2", "gamma", "pytest>=7", "Pillow>=10,<=15"]
deps = {b: a for a, b in (re.findall(r"^(([^!=<>~ ]+)(?:[!=<>~ ].*)?$)", x)[0] for x in _deps)}


def deps_list(*pkgs):
    return [deps[pkg] for pkg in pkgs]


class DepsTableUpdateCommand(Command):
    user_options = []


install_requires = deps_list("alpha", "gamma") + [deps["Pillow"] + ";python_version<'3'"]

setup(
    name="transformers",
    version="5.25.0.dev0",
    long_description=Path("README.md").read_text(),
    package_dir={"": "src"},
    packages=find_packages("src"),
    install_requires=list(install_requires),
    cmdclass={"deps_table_update": DepsTableUpdateCommand},
)
"""
FAKE_TRANSFORMERS = {  # a transformers checkout: src/ layout, its requirements computed in setup.py
    "setup.py": FAKE_TRANSFORMERS_SETUP,
    "README.md": "fake\n",
    "src/transformers/__init__.py": '__version__ = "5.25.0.dev0"\nimport alpha, gamma\n',
    "src/transformers/models/llama/modeling_llama.py": "BROKEN = False\n",
}


@pytest.mark.parametrize("tool", ["uv", "pip"])
def test_a_transformers_commit_is_its_checkout_on_the_path_with_its_setup_py_requirements(
    tmp_path, uv, offline, tool, monkeypatch
):
    monkeypatch.setattr(environments, "project_dependencies", lambda: [])  # the harness's own: not in the fake index
    clone = tmp_path / "transformers"
    make_repo(clone, pyproject("transformers", "src"), [("Initial", dict(FAKE_TRANSFORMERS), "v5.24.0")])
    sha = commit(
        clone, "Refactor llama (#40102)", {"src/transformers/models/llama/modeling_llama.py": "BROKEN = True\n"}
    )
    root = tmp_path / "envs"
    installer = uv if tool == "uv" else installers.Installer(None)
    spec = commit_environment(
        root, clone, sha, {"deepspeed": "0.19.8", "transformers": "5.24.0", "torch": "2.13.0"}, axis="transformers"
    )
    ensure_environment(root, spec.base, tool=installer)
    before = {layer.key: tree_hash(root / layer.key) for layer in spec.lower()}
    python = ensure_environment(root, spec, tool=installer)
    assert {layer.key: tree_hash(root / layer.key) for layer in spec.lower()} == before

    shown = json.loads(
        subprocess.run(
            [
                str(python),
                "-c",
                """if True:
        import json, alpha, transformers, transformers.models.llama.modeling_llama as llama
        from importlib import metadata
        print(json.dumps({"version": transformers.__version__, "metadata": metadata.version("transformers"),
                          "file": transformers.__file__, "broken": llama.BROKEN, "alpha": alpha.VERSION,
                          "requires": metadata.requires("transformers"),
                          "direct_url": json.loads(
                              metadata.distribution("transformers").read_text("direct_url.json"))}))""",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert shown["version"] == shown["metadata"] == "5.25.0.dev0"
    assert shown["file"] == str(root / spec.key / "src" / "src" / "transformers" / "__init__.py")  # the checkout
    assert shown["broken"] is True  # the commit's own tree
    assert shown["requires"] == ["alpha>=2", "gamma", "Pillow>=10,<=15;python_version<'3'"]  # as setup.py computed them
    assert shown["direct_url"]["vcs_info"] == {"vcs": "git", "commit_id": sha}
    # its requirements that the lower layers lack (alpha 2.0 came with torch), nothing built: no package folder
    assert own_packages(root, spec.key) == {"transformers": "5.25.0.dev0", "gamma": "1.0"}
    assert not (Path(sysconfig_purelib(python)) / "transformers").exists()


def test_a_checkout_states_its_requirements_in_setup_py_or_a_static_pyproject_or_gets_a_clear_error(tmp_path):
    setup_py = tmp_path / "setup-py"
    for path, text in FAKE_TRANSFORMERS.items():
        (setup_py / path).parent.mkdir(parents=True, exist_ok=True)
        (setup_py / path).write_text(text)
    assert project_metadata(setup_py, Path(sys.executable), dict(os.environ)) == (
        "5.25.0.dev0",
        ["alpha>=2", "gamma", "Pillow>=10,<=15;python_version<'3'"],
    )

    static = tmp_path / "pyproject"
    static.mkdir()
    (static / "pyproject.toml").write_text(
        '[project]\nname = "transformers"\nversion = "6.0.0"\ndependencies = ["gamma"]\n'
    )
    assert project_metadata(static, Path(sys.executable), dict(os.environ)) == ("6.0.0", ["gamma"])

    dynamic = tmp_path / "dynamic"
    dynamic.mkdir()
    (dynamic / "pyproject.toml").write_text('[project]\nname = "transformers"\ndynamic = ["version", "dependencies"]\n')
    with pytest.raises(InstallError, match=f"^{dynamic}: neither a setup.py nor a pyproject.toml"):
        project_metadata(dynamic, Path(sys.executable), dict(os.environ))
