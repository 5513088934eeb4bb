"""DeepSpeed's CPU comm op built once per key of its sources (sessions/deepspeed_ops.py), on fake DeepSpeed
trees: the real probe script runs against a fake `deepspeed` and `torch` whose "JIT build" writes a file
and counts itself, so the test sees which layers build and which reuse."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

from sessions.deepspeed_ops import MARK, install_prebuilt_ops, op_key

FAKE_TORCH = 'import os\n__version__ = os.environ.get("FAKE_TORCH_VERSION", "2.13.0+cpu")\n' \
             'class cuda:\n    @staticmethod\n    def is_available():\n        return False\n'
FAKE_BUILDER = textwrap.dedent("""\
    import os
    from pathlib import Path

    class ShareMemCommBuilder:
        NAME = "deepspeed_shm_comm"

        def __init__(self):
            self.name = self.NAME

        def absolute_name(self):
            return f"deepspeed.ops.comm.{self.NAME}_op"

        def sources(self):
            return ["csrc/cpu/comm/shm_interface.cpp", "csrc/cpu/comm/shm.cpp"]

        def include_paths(self):
            return ["csrc/cpu/includes"]

        def cxx_args(self):
            return ["-O2", "-fopenmp"]

        def extra_ldflags(self):
            return []

        def strip_empty_entries(self, args):
            return [x for x in args if len(x) > 0]

        def deepspeed_src_path(self, code_path):
            return os.path.join(Path(__file__).parent.parent.parent.absolute(), code_path)

        def jit_load(self, verbose=True):
            folder = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / self.name
            folder.mkdir(parents=True)
            (folder / f"{self.name}.so").write_text("built")
            with open(os.environ["FAKE_BUILD_LOG"], "a") as log:
                log.write(self.name + "\\n")
            class Module:
                __file__ = str(folder / f"{self.name}.so")
            return Module
""")
INSTALLED_INFO = "version='0.19.8'\ninstalled_ops={'deepspeed_shm_comm': False}\naccelerator_name='cpu'\n" \
                 "torch_info={'version': '0.0'}\n"


def fake_layer(folder: Path, shm_header: str = "int shm;\n", include: str = "int x;\n") -> Path:
    """A layer's site-packages holding fake torch and DeepSpeed; returns that site-packages."""
    site = folder / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(FAKE_TORCH)
    ops = site / "deepspeed" / "ops"
    (ops / "op_builder" / "cpu").mkdir(parents=True)
    for package in (site / "deepspeed", ops, ops / "op_builder"):
        (package / "__init__.py").write_text("")
    (ops / "op_builder" / "cpu" / "__init__.py").write_text(FAKE_BUILDER)
    (site / "deepspeed" / "git_version_info.py").write_text("from .git_version_info_installed import *\n")
    (site / "deepspeed" / "git_version_info_installed.py").write_text(INSTALLED_INFO)
    (ops / "csrc" / "cpu" / "comm").mkdir(parents=True)
    (ops / "csrc" / "cpu" / "includes").mkdir(parents=True)
    (ops / "csrc" / "cpu" / "comm" / "shm.cpp").write_text('#include "shm.h"\n')
    (ops / "csrc" / "cpu" / "comm" / "shm_interface.cpp").write_text("PYBIND11_MODULE(...)\n")
    (ops / "csrc" / "cpu" / "comm" / "shm.h").write_text(shm_header)
    (ops / "csrc" / "cpu" / "includes" / "simd.h").write_text(include)
    return site


def key_of(site: Path, torch: str = "2.13.0+cpu", compiler: str = "c++ (Debian 12.2.0-14) 12.2.0") -> str:
    comm = site / "deepspeed" / "ops" / "csrc" / "cpu" / "comm"
    return op_key([comm / "shm_interface.cpp", comm / "shm.cpp"], [comm.parent / "includes"], ["-O2", "-fopenmp"],
                  torch, compiler)


def test_equal_op_sources_elsewhere_share_a_key_and_any_change_gets_another(tmp_path):
    a, b = fake_layer(tmp_path / "a"), fake_layer(tmp_path / "b")
    assert key_of(a) == key_of(b)  # same files at other paths (another release's layer)
    assert key_of(fake_layer(tmp_path / "header", shm_header="int shm2;\n")) != key_of(a)  # a header next to the sources
    assert key_of(fake_layer(tmp_path / "include", include="int y;\n")) != key_of(a)  # csrc/cpu/includes
    assert key_of(a, torch="2.14.1+cpu") != key_of(a)
    assert key_of(a, compiler="c++ (Debian 13.1.0-1) 13.1.0") != key_of(a)
    (b / "deepspeed" / "ops" / "csrc" / "cpu" / "comm" / "shm.cpp").write_text('#include "shm.h"\n// fixed\n')
    assert key_of(b) != key_of(a)


def install(root: Path, site: Path, log: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(site), "FAKE_BUILD_LOG": str(root / "builds.log")}
    return install_prebuilt_ops(root, Path(sys.executable), site, env, log.append)


def test_a_layer_reuses_the_build_of_equal_sources_and_a_changed_csrc_gets_its_own(tmp_path):
    root = tmp_path / "envs"
    root.mkdir()
    said: list[str] = []
    release = fake_layer(tmp_path / "release")
    key = install(root, release, said)
    library = release / "deepspeed" / "ops" / "comm" / "deepspeed_shm_comm_op.so"
    assert library.resolve() == root / ".ops" / key / "deepspeed_shm_comm_op.so"
    info = (release / "deepspeed" / "git_version_info_installed.py").read_text()
    assert f"installed_ops = {{**installed_ops, 'deepspeed_shm_comm': True}}  {MARK} {key}" in info
    assert f"torch_info = {{**torch_info, 'version': '2.13'}}  {MARK} {key}" in info

    same = fake_layer(tmp_path / "next-release")
    assert install(root, same, said) == key
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
    root.mkdir()
    site = fake_layer(tmp_path / "gpu")
    (site / "deepspeed" / "git_version_info_installed.py").write_text(INSTALLED_INFO.replace("'cpu'", "'cuda'"))
    said: list[str] = []
    assert install(root, site, said) == ""
    assert said == ["DeepSpeed's CPU comm op is not prebuilt: DeepSpeed was installed for accelerator 'cuda', not cpu"]
    assert not (site / "deepspeed" / "ops" / "comm").exists()
