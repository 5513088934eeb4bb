"""Run by a layer's own python in a source checkout (stdlib only): the name, version and requirements its
setup.py passes to `setup()`, without building anything. setuptools (and distutils, which old setup.py
files import their Command from) are stand-ins that record the call; the setup.py itself runs as it would
in a build, so requirements it computes (transformers' `deps_list(...)`, markers added by string) come out
as the build would write them. Prints one JSON object."""

import json
import sys
import types

recorded: dict = {}


class _Anything:
    """A stand-in for a class or function setup.py only names or subclasses (Command, Extension...)."""

    user_options: list = []

    def __init__(self, *args, **kwargs):
        pass


def _setup(**kwargs):
    recorded.update(kwargs)


def _find_packages(*args, **kwargs):
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

if __name__ == "__main__":
    sys.argv = ["setup.py", "--version"]
    with open("setup.py") as source:
        exec(compile(source.read(), "setup.py", "exec"), {"__name__": "__main__", "__file__": "setup.py"})
    print(
        json.dumps(
            {
                "name": recorded.get("name"),
                "version": recorded.get("version"),
                "install_requires": [str(line) for line in recorded.get("install_requires") or []],
            }
        )
    )
