"""Every DeepSpeed patch matrix/remedies.toml ships applies (`git apply --check`) to the release it names, after the
patches it `requires` (applied in their order). The release's files come from the DeepSpeed the tests run on (pinned:
sessions/nox_sessions.py `TESTS_PINS`), whose
package sources are the PyPI sdist's, so the check downloads nothing; a patch against another release is skipped
naming both."""

import importlib.metadata
import importlib.util
import re
import shutil
from pathlib import Path

import pytest

from matrix.remedies import MATRIX_DIR, Remedy, load_remedies, required_patches
from suites.base.git import git_output, run_git

ROOT = MATRIX_DIR.parent


def touched_files(diff: str) -> list[str]:
    """The files a unified diff changes, as paths inside the release (`deepspeed/module_inject/auto_tp.py`)."""
    return sorted(set(re.findall(r"^\+\+\+ b/(\S+)", diff, flags=re.MULTILINE)))


def created_files(diff: str) -> set[str]:
    """The files a unified diff creates (`--- /dev/null`): the release need not have them."""
    return set(re.findall(r"^--- /dev/null\n\+\+\+ b/(\S+)", diff, flags=re.MULTILINE))


def release_tree(diff: str, folder: Path) -> Path:
    """A git folder holding the installed DeepSpeed's files that `diff` changes, at their paths in the sdist (a file
    the diff creates is copied too where the release has one, so that `git apply --check` refuses to create it)."""
    spec = importlib.util.find_spec("deepspeed")
    assert spec is not None and spec.origin, "deepspeed is not installed in the test environment"
    site = Path(spec.origin).parent.parent
    for name in touched_files(diff):
        if name in created_files(diff) and not (site / name).exists():
            continue
        assert (site / name).is_file(), f"the patch changes {name}, which the installed deepspeed has no file at"
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(site / name, folder / name)
    folder.mkdir(parents=True, exist_ok=True)
    git_output("init", "-q", folder=folder)
    return folder


def apply_check(diff_path: Path, folder: Path) -> str:
    """git's complaint when the diff does not apply to `folder`'s files, "" when it does."""
    check = run_git("apply", "--check", str(diff_path), folder=folder)
    return check.stderr.strip() if check.returncode else ""


REMEDIES = load_remedies()
PATCHES = [remedy for remedy in REMEDIES if remedy.kind == "patch"]


@pytest.mark.parametrize("remedy", PATCHES, ids=[remedy.name for remedy in PATCHES])
def test_a_shipped_patch_applies_to_its_release(remedy: Remedy, tmp_path):
    installed = importlib.metadata.version("deepspeed")
    if installed != remedy.deepspeed:
        pytest.skip(f"{remedy.patch} is against deepspeed {remedy.deepspeed}; the tests run on {installed}")
    diff = remedy.patch_path(ROOT)
    assert touched_files(diff.read_text()), f"{remedy.patch} changes no file"
    stack = [required.patch_path(ROOT) for required in required_patches(remedy, REMEDIES)]
    folder = release_tree("".join(path.read_text() for path in (*stack, diff)), tmp_path)
    for required in stack:
        git_output("apply", str(required), folder=folder)
    assert apply_check(diff, folder) == ""


def test_a_patch_whose_context_is_not_the_release_is_caught(tmp_path):
    """The check can fail: the norm patch with one context line that is not DeepSpeed's."""
    (remedy,) = [patch for patch in PATCHES if patch.name == "rmsnorm-split-width-statistic"]
    text = remedy.patch_path(ROOT).read_text()
    broken = text.replace("        if has_unsharded_high_dimensional_param:\n", "        if high_dimensional:\n", 1)
    assert broken != text
    (tmp_path / "broken.diff").write_text(broken)
    folder = release_tree(broken, tmp_path / "release")
    assert "patch does not apply" in apply_check(tmp_path / "broken.diff", folder)


def test_a_patch_that_creates_a_file_the_release_has_is_caught(tmp_path):
    """A new module passes only where the release has no file of that name: a diff that creates `auto_tp.py`, which
    DeepSpeed has, is refused, as a diff that creates `mamba_mixer.py` is not."""
    (remedy,) = [patch for patch in PATCHES if patch.name == "mamba-mixer-split-per-part"]
    text = remedy.patch_path(ROOT).read_text()
    new_module = text[text.index("diff --git a/deepspeed/module_inject/mamba_mixer.py") :]
    clash = new_module.replace("mamba_mixer.py", "auto_tp.py")
    for name, diff in (("new.diff", new_module), ("clash.diff", clash)):
        (tmp_path / name).write_text(diff)
    assert created_files(clash) == {"deepspeed/module_inject/auto_tp.py"}
    assert apply_check(tmp_path / "new.diff", release_tree(new_module, tmp_path / "new")) == ""
    assert "already exists" in apply_check(tmp_path / "clash.diff", release_tree(clash, tmp_path / "clash"))
