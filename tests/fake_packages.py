"""Git repositories of fake packages, written by the tests that bisect and triage real commits."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path


def pyproject(name: str, where: str = ".", include: str = "*") -> str:
    """A setuptools project of the packages matching `include` found under `where` (a fake DeepSpeed that only
    carries deepspeed/__init__.py to look like a DeepSpeed clone, reports.clones.git.PROJECT_FILE, installs
    `fakeds*`)."""
    return textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{name}"
        version = "0.1.0"
        [tool.setuptools.packages.find]
        where = ["{where}"]
        include = ["{include}"]
    """)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def make_repo(path: Path, pyproject: str, history: list[tuple[str, dict[str, str | None], str]]) -> list[str]:
    """A git repository at path: pyproject.toml, then one commit per (subject, {file: text}, tag or "");
    a text of None writes the pyproject back. Returns the shas in history order."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "--quiet", "--initial-branch", "main")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "user.name", "t")
    (path / "pyproject.toml").write_text(pyproject)
    shas = []
    for subject, files, tag in history:
        for file, text in files.items():
            (path / file).parent.mkdir(parents=True, exist_ok=True)
            (path / file).write_text(pyproject if text is None else text)
        git(path, "add", "--all")
        git(path, "commit", "--quiet", "-m", subject)
        shas.append(git(path, "rev-parse", "HEAD"))
        if tag:
            git(path, "tag", tag)
    return shas


FAKE_TORCH_VERSION = "__version__ = '2.13.0+cpu'\ncuda = None\nhip = None\n"
"""torch/version.py of a CPU build: what the environments read torch's build from."""
FAKE_CPU_BUILDER = textwrap.dedent("""\
    import os
    from pathlib import Path

    class CPUOpBuilder:
        def strip_empty_entries(self, args):
            return [x for x in args if len(x) > 0]

        def extra_ldflags(self):
            return []

        def deepspeed_src_path(self, code_path):
            # as DeepSpeed's op_builder/builder.py resolves them: relative to deepspeed/ops
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
FAKE_COMM_BUILDER = textwrap.dedent("""\
    from .builder import CPUOpBuilder

    class ShareMemCommBuilder(CPUOpBuilder):
        NAME = "deepspeed_shm_comm"

        def __init__(self):
            self.name = self.NAME

        def absolute_name(self):
            return f"deepspeed.ops.comm.{self.NAME}_op"

        def sources(self):
            return ["csrc/cpu/comm/shm_interface.cpp", "csrc/cpu/comm/shm.cpp"]

        def include_paths(self):
            includes = ["csrc/cpu/includes"]
            return includes

        def cxx_args(self):
            return ["-O2", "-fopenmp"]
""")


def fake_comm_op(shm_header: str = "int shm;\n", include: str = "int x;\n") -> dict[str, str]:
    """DeepSpeed's op builders and CPU comm op sources as a DeepSpeed checkout holds them (`op_builder/`,
    `csrc/`; an installed DeepSpeed has them under deepspeed/ops/): the builder's "JIT build" writes a file
    and appends the op's name to $FAKE_BUILD_LOG, so a test sees which layers build and which reuse."""
    return {
        "op_builder/__init__.py": "",
        "op_builder/cpu/__init__.py": "from .comm import ShareMemCommBuilder\n",
        "op_builder/cpu/builder.py": FAKE_CPU_BUILDER,
        "op_builder/cpu/comm.py": FAKE_COMM_BUILDER,
        "csrc/cpu/comm/shm.cpp": '#include "shm.h"\n',
        "csrc/cpu/comm/shm_interface.cpp": "PYBIND11_MODULE(...)\n",
        "csrc/cpu/comm/shm.h": shm_header,
        "csrc/cpu/includes/simd.h": include,
    }
