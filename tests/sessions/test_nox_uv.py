"""nox looks for a uv when each session starts and logs "uv binary not found" without one: the noxfile
points nox at the harness's pinned uv (sessions/installers.py point_nox_at_the_pinned_uv)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from matrix import PROJECT_ROOT
from sessions.environments import ENV_ROOT_ENV, env_root


def run_nox(folder: Path, give_uv: bool) -> str:
    (folder / "noxfile.py").write_text(
        textwrap.dedent(f"""\
        import sys
        from pathlib import Path
        import nox
        sys.path.insert(0, {str(PROJECT_ROOT)!r})
        from sessions.installers import point_nox_at_the_pinned_uv
        if {give_uv}:
            point_nox_at_the_pinned_uv(Path({str(env_root())!r}))

        @nox.session(python=False)
        def nothing(session):
            import nox.virtualenv
            print("nox uses", nox.virtualenv.find_uv())
    """)
    )
    env = {key: value for key, value in os.environ.items() if key not in ("UV", "AUTOTP_INSTALLER")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])  # no uv on it
    env[ENV_ROOT_ENV] = str(env_root())
    done = subprocess.run(
        [sys.executable, "-m", "nox", "-s", "nothing"], cwd=folder, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout + done.stderr


@pytest.mark.parametrize("give_uv", [True, False])
def test_nox_finds_the_pinned_uv_and_says_nothing_about_a_missing_one(tmp_path, uv, give_uv):
    output = run_nox(tmp_path, give_uv)
    if give_uv:
        assert "uv binary not found" not in output
        assert f"nox uses (True, '{uv.uv}'" in output
    else:  # the line the noxfile avoids: nox without the harness's uv
        assert "uv binary not found" in output
