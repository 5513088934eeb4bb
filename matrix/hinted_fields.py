"""What the two readers of typed records share (matrix/toml_tables.py, the TOML tables of matrix/;
matrix/json_records.py, the JSON records other processes and runs wrote): the error that names a field by its path,
the path's spelling, the type test of one value and a dataclass's fields as a reader sees them. Each reader walks
the type hints with its own file's rules (TOML has no null and builds a version from its text; JSON holds several
types in a union and takes an instance a reshaping built) and names the types as its file's editor calls them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, Field, fields
from functools import cache
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class FieldError(ValueError):
    """A value that does not fit its field: `field` is the dotted path of the field inside the record ("" for the
    record itself), `problem` what is wrong, said after it (`must be ...`, `has unknown ...`)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field '{field}' {problem}" if field else problem)
        self.field = field
        self.problem = problem


def join(path: str, name: str) -> str:
    """The dotted path of `name` inside `path` (either may be "")."""
    return f"{path}.{name}" if path and name else path or name


def expect(kind: type | tuple[type, ...], value: object, path: str, names: Mapping[type, str], name: str = "") -> Any:
    """`value` if it is of `kind` (true/false is no number, though bool subclasses int); else a FieldError saying
    what it must be, `name` or the file's name of `kind` (`names`)."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise FieldError(path, f"must be {name or names[cast(type, kind)]}, got {value!r}")
    return value


@cache
def init_fields(cls: type[DataclassInstance]) -> tuple[dict[str, Field[Any]], frozenset[str]]:
    """The fields a reader sets (those of `__init__`) by name, and those of them without a default."""
    init = {f.name: f for f in fields(cls) if f.init}
    required = frozenset(name for name, f in init.items() if f.default is MISSING and f.default_factory is MISSING)
    return init, required
