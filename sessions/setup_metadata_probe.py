"""Run by a layer's own python in a source checkout (stdlib only): the name, version and requirements its
setup.py passes to `setup()`, without building anything. setuptools (and distutils, which old setup.py
files import their Command from) are stand-ins that record the call; the setup.py itself runs as it would
in a build, so requirements it computes (transformers' `deps_list(...)`, markers added by string) come out
as the build would write them. Prints one JSON object."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterable

recorded: dict[str, object] = {}


class _Anything:
    """A stand-in for a class or function setup.py only names or subclasses (Command, Extension...)."""

    user_options: list[tuple[str, str | None, str]] = []  # distutils' (long name, short name, help)

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass


def _setup(**kwargs: object) -> None:
    recorded.update(kwargs)


def _find_packages(*args: object, **kwargs: object) -> list[str]:
    return []


def _stand_in(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    vars(module).update(
        setup=_setup,
        find_packages=_find_packages,
        find_namespace_packages=_find_packages,
        __getattr__=lambda attribute: _Anything,
    )
    return module


for _name in (
    "setuptools",
    "setuptools.command",
    "setuptools.command.build_py",
    "setuptools.command.install",
    "distutils",
    "distutils.core",
    "distutils.cmd",
):
    sys.modules[_name] = _stand_in(_name)


def _requirements(value: object) -> list[object]:
    """setup()'s install_requires: requirement lines (a list, or what a setup.py computes), or absent."""
    return list(value) if value and isinstance(value, Iterable) else []


if __name__ == "__main__":
    sys.argv = ["setup.py", "--version"]
    with open("setup.py") as source:
        exec(compile(source.read(), "setup.py", "exec"), {"__name__": "__main__", "__file__": "setup.py"})
    print(
        json.dumps(
            {
                "name": recorded.get("name"),
                "version": recorded.get("version"),
                "install_requires": [str(line) for line in _requirements(recorded.get("install_requires"))],
            }
        )
    )
