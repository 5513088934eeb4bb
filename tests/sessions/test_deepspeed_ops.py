"""DeepSpeed's CPU comm op built once per key of its sources (sessions/deepspeed_ops.py), on fake DeepSpeed
trees: the real probe script runs against a fake `deepspeed` and `torch` whose "JIT build" writes a file
and counts itself, so the test sees which layers build and which reuse, and which describe the op by
importing DeepSpeed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from sessions.deepspeed_ops import (
    MARK,
    CommOp,
    _describe_by_import,
    compiler_identity,
    describe_from_files,
    install_prebuilt_ops,
    op_key,
)
from tests.fake_packages import FAKE_TORCH_VERSION, fake_comm_op

FAKE_TORCH = (
    "from .version import __version__\nclass cuda:\n    @staticmethod\n    def is_available():\n        return False\n"
)
INSTALLED_INFO = (
    "version='0.19.8'\ninstalled_ops={'deepspeed_shm_comm': False}\naccelerator_name='cpu'\n"
    "torch_info={'version': '0.0'}\n"
)


def fake_layer(folder: Path, shm_header: str = "int shm;\n", include: str = "int x;\n") -> Path:
    """A layer's site-packages holding fake torch and DeepSpeed; returns that site-packages."""
    site = folder / "site-packages"
    files = {
        "torch/__init__.py": FAKE_TORCH,
        "torch/version.py": FAKE_TORCH_VERSION,
        "deepspeed/__init__.py": "",
        "deepspeed/ops/__init__.py": "",
        "deepspeed/git_version_info.py": "from .git_version_info_installed import *\n",
        "deepspeed/git_version_info_installed.py": INSTALLED_INFO,
        **{f"deepspeed/ops/{path}": text for path, text in fake_comm_op(shm_header, include).items()},
    }
    for path, text in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    return site


def key_of(site: Path, compiler: str = "c++ (Debian 12.2.0-14) 12.2.0") -> str:
    op = describe_from_files(site, [str(site)])
    assert isinstance(op, CommOp), op
    return op_key(op, compiler)


def test_equal_op_sources_elsewhere_share_a_key_and_any_change_gets_another(tmp_path):
    a, b = fake_layer(tmp_path / "a"), fake_layer(tmp_path / "b")
    assert key_of(a) == key_of(b)  # same files at other paths (another release's layer)
    assert key_of(fake_layer(tmp_path / "header", shm_header="int shm2;\n")) != key_of(
        a
    )  # a header next to the sources
    assert key_of(fake_layer(tmp_path / "include", include="int y;\n")) != key_of(a)  # csrc/cpu/includes
    assert key_of(a, compiler="c++ (Debian 13.1.0-1) 13.1.0") != key_of(a)
    newer_torch = fake_layer(tmp_path / "torch")
    (newer_torch / "torch" / "version.py").write_text(FAKE_TORCH_VERSION.replace("2.13.0", "2.14.1"))
    assert key_of(newer_torch) != key_of(a)
    flags = fake_layer(tmp_path / "flags")  # the builder's flags
    comm = flags / "deepspeed" / "ops" / "op_builder" / "cpu" / "comm.py"
    comm.write_text(comm.read_text().replace('"-O2"', '"-O3"'))
    assert key_of(flags) != key_of(a)
    (b / "deepspeed" / "ops" / "csrc" / "cpu" / "comm" / "shm.cpp").write_text('#include "shm.h"\n// fixed\n')
    assert key_of(b) != key_of(a)


def test_the_files_describe_the_op_as_importing_deepspeed_does(tmp_path):
    site = fake_layer(tmp_path / "layer")
    described = _describe_by_import(Path(sys.executable), site, {**os.environ, "PYTHONPATH": str(site)})
    assert not isinstance(described, str), described
    by_import, _ = described
    assert describe_from_files(site, [str(site)]) == by_import


def test_a_builder_that_computes_its_sources_is_described_by_importing_deepspeed(tmp_path):
    site = fake_layer(tmp_path / "layer")
    comm = site / "deepspeed" / "ops" / "op_builder" / "cpu" / "comm.py"
    comm.write_text(
        comm.read_text().replace(
            'return ["csrc/cpu/comm/shm_interface.cpp", "csrc/cpu/comm/shm.cpp"]',
            'return [f"csrc/cpu/comm/{name}.cpp" for name in ("shm_interface", "shm")]',
        )
    )
    assert (
        describe_from_files(site, [str(site)])
        == f"{comm}: ShareMemCommBuilder's sources() or include_paths() is not a list of strings"
    )
    said: list[str] = []
    key = install(tmp_path / "envs", site, said)
    assert key and said[0].startswith("DeepSpeed's CPU comm op is described by importing DeepSpeed: ")


def install(root: Path, site: Path, log: list[str], importable: bool = True) -> str:
    """install_prebuilt_ops for the fake layer; `importable=False`: the layer's DeepSpeed cannot be imported."""
    root.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(site) if importable else "", "FAKE_BUILD_LOG": str(root / "builds.log")}
    return install_prebuilt_ops(
        root, Path(sys.executable), package_root=site, lower=[str(site)], env=env, log=log.append
    )


def test_a_layer_reuses_the_build_of_equal_sources_without_importing_deepspeed_and_a_changed_csrc_gets_its_own(
    tmp_path,
):
    root = tmp_path / "envs"
    said: list[str] = []
    release = fake_layer(tmp_path / "release")
    key = install(root, release, said)
    assert key == op_key(describe_from_files(release, [str(release)]), compiler_identity())  # type: ignore[arg-type]
    library = release / "deepspeed" / "ops" / "comm" / "deepspeed_shm_comm_op.so"
    assert library.resolve() == root / ".ops" / key / "deepspeed_shm_comm_op.so"
    assert json.loads((root / ".ops" / key / "built-from.json").read_text())["name"] == "deepspeed_shm_comm"
    info = (release / "deepspeed" / "git_version_info_installed.py").read_text()
    assert f"installed_ops = {{**installed_ops, 'deepspeed_shm_comm': True}}  {MARK} {key}" in info
    assert f"torch_info = {{**torch_info, 'version': '2.13'}}  {MARK} {key}" in info

    # A DeepSpeed that cannot even be imported: reuse needs only its files
    same = fake_layer(tmp_path / "next-release")
    assert install(root, same, said, importable=False) == key
    assert (same / "deepspeed" / "ops" / "comm" / "deepspeed_shm_comm_op.so").resolve() == library.resolve()
    assert (root / "builds.log").read_text().splitlines() == ["deepspeed_shm_comm_op"]  # built once for both
    assert said[-1] == f"deepspeed.ops.comm.deepspeed_shm_comm_op: reusing the build of key {key}"

    commit = fake_layer(tmp_path / "commit", shm_header="int shm; // a commit changing csrc/\n")
    other = install(root, commit, said)
    assert other != key and (root / ".ops" / other / "deepspeed_shm_comm_op.so").exists()
    assert len((root / "builds.log").read_text().splitlines()) == 2
    # installing again (a rebuilt layer) leaves one mark per line, not two
    install(root, commit, said)
    assert (commit / "deepspeed" / "git_version_info_installed.py").read_text().count(MARK) == 2


def test_a_layer_that_would_not_use_the_cpu_op_is_left_to_jit(tmp_path):
    root = tmp_path / "envs"
    site = fake_layer(tmp_path / "gpu")
    (site / "deepspeed" / "git_version_info_installed.py").write_text(INSTALLED_INFO.replace("'cpu'", "'cuda'"))
    said: list[str] = []
    assert install(root, site, said) == ""
    installed = site / "deepspeed" / "git_version_info_installed.py"
    assert said == [
        f"DeepSpeed's CPU comm op is described by importing DeepSpeed: {installed} does not say "
        "accelerator_name='cpu' (it says 'cuda')",
        "DeepSpeed's CPU comm op is not prebuilt: DeepSpeed was installed for accelerator 'cuda', not cpu",
    ]
    assert not (site / "deepspeed" / "ops" / "comm").exists()
