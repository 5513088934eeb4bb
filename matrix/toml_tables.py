"""One reader for the TOML tables of matrix/: a table becomes a frozen dataclass by the class's own fields and type
hints, so each file's rules are written once, on the class, and every message names the file, the entry and the
field.

What a field's hint accepts:
- `str`, `int` (not true/false), `float` (an integer is read as a float), `bool`;
- `Literal[...]`: one of its values, of the same type (`true` is not `1`);
- `tuple[X, ...]`: an array of X; `dict[K, V]`: a table of V whose keys a Literal K names (any key for `str`);
- `X | None`: X (TOML has no null: a field left out keeps its default);
- a dataclass: a nested table, read by the same rules;
- `Any`: anything, as written;
- any other class (packaging's `Version`): a string it is built from.
A field without a default must be in the table; a key that is no field is refused with the closest field's name.
Fields a file never sets (filled in by code) carry `NOT_IN_FILE` as their metadata; a field whose right spelling
is not obvious from its type says how to write it with `written_as(...)`, added to every message about it.

Rules across fields go in the class's `validate(self) -> None`, which raises `TableError`; the reader calls it after
building the instance, and only the reader: dataclasses built in code (a shape read from a transformers config, a
record rebuilt from JSON) are no file entries. Rules that need what the class cannot know (the failure classes of a
layer above, the table's own key) go in the `rules` argument, which raises `TableError` the same way.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import Field, is_dataclass
from functools import cache
from types import MappingProxyType, NoneType, UnionType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union, cast, get_args, get_origin, get_type_hints

from matrix.hinted_fields import FieldError, expect, init_fields, join

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Table = TypeVar("Table", bound="DataclassInstance")

NOT_IN_FILE: Mapping[str, bool] = MappingProxyType({"in_file": False})
"""Metadata of a dataclass field that code fills in and a file may not set."""


def written_as(example: str) -> Mapping[str, str]:
    """Metadata of a dataclass field: how to write its value (`a version range such as '>=4.46, <4.54'`), said in
    every message about the field."""
    return MappingProxyType({"written_as": example})


TOML_NAMES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "a table",
    list: "an array",
}
"""What a file's editor calls each type a TOML value can have."""


class TableError(FieldError):
    """A rule a table breaks (a class's `validate`, a caller's `rules`): `field` is the dotted path of the field
    inside the table ("" for the table itself), `problem` what is wrong, said after it (`must be ...`)."""


@cache
def _hints(cls: type) -> dict[str, Any]:
    """A table class's field types, resolved once: `get_type_hints` compiles every string annotation on each call,
    which made most of a render's time (18,000 calls for one default matrix's repro scripts)."""
    return get_type_hints(cls)


def read_table(
    cls: type[Table],
    raw: object,
    *,
    where: str,
    error: Callable[[str], Exception],
    given: Mapping[str, object] | None = None,
    rules: Callable[[Table], None] | None = None,
) -> Table:
    """The table `raw` as a `cls`. `where` names the file and the entry (`models.toml: entry [models.llama]`), and
    every message starts with it; `error` builds the exception raised; `given`: fields the caller sets (the entry's
    name, its table key), which the table may not; `rules`: the caller's rules, after the class's `validate`."""
    try:
        table = _read_dataclass(cls, raw, "", given or {})
        if rules is not None:
            rules(table)
    except FieldError as broken:
        raise error(f"{where} {broken}") from None
    return table


def _read_dataclass(cls: type[Table], raw: object, path: str, given: Mapping[str, object]) -> Table:
    if not isinstance(raw, dict):
        raise TableError(path, f"must be a table, got {raw!r}")
    init, required = init_fields(cls)
    readable = {name: f for name, f in init.items() if f.metadata.get("in_file", True) and name not in given}
    unknown = sorted(set(raw) - set(readable))
    if unknown:
        raise TableError(
            path, f"has unknown field(s) {unknown}; {_did_you_mean(unknown, readable)}known fields: {sorted(readable)}"
        )
    missing = [name for name in readable if name not in raw and name in required]
    if missing:
        raise TableError(path, f"is missing required field{'s' if len(missing) > 1 else ''} {_quoted(missing)}")
    hints = _hints(cls)
    values = {name: _read_field(readable[name], hints[name], value, join(path, name)) for name, value in raw.items()}
    try:
        table = cast(Callable[..., Table], cls)(**given, **values)
        validate: Callable[[], None] | None = getattr(table, "validate", None)
        if validate is not None:
            validate()
    except FieldError as broken:  # a rule of a nested table: named from the outer table
        raise TableError(join(path, broken.field), broken.problem) from None
    return table


def _read_field(field: Field[Any], hint: Any, value: object, path: str) -> Any:
    """`value` read by its field's hint; a message about it says how to write it where the field says."""
    try:
        return _read_value(hint, value, path)
    except FieldError as broken:
        example = field.metadata.get("written_as")
        if example is None:
            raise
        raise TableError(broken.field, f"{broken.problem}; write it as {example}") from None


def _read_value(hint: Any, value: object, path: str) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if origin is Literal:
        if not any(type(value) is type(allowed) and value == allowed for allowed in args):
            raise TableError(path, f"must be one of {args}, got {value!r}{_close_to(value, args)}")
        return value
    if origin in (Union, UnionType):
        (inner,) = (arg for arg in args if arg is not NoneType)
        return _read_value(inner, value, path)
    if origin is tuple:
        items = _expect(list, value, path)
        return tuple(_read_value(args[0], item, f"{path}[{index}]") for index, item in enumerate(items))
    if origin is dict:
        key_type, value_type = args
        table = _expect(dict, value, path)
        if get_origin(key_type) is Literal:
            allowed = get_args(key_type)
            for key in table:
                if key not in allowed:
                    raise TableError(path, f"has unknown key {key!r}{_close_to(key, allowed)}; use one of {allowed}")
        return {key: _read_value(value_type, item, join(path, _key(key))) for key, item in table.items()}
    if is_dataclass(hint):
        return _read_dataclass(cast("type[DataclassInstance]", hint), value, path, {})
    if hint is float:
        return float(_expect((int, float), value, path, "a number"))
    if hint in TOML_NAMES:
        return _expect(hint, value, path)
    text = _expect(str, value, path)
    try:
        return hint(text)
    except ValueError as error:
        raise TableError(path, f"must be a {hint.__name__} ({error}), got {text!r}") from None


def _expect(kind: type | tuple[type, ...], value: object, path: str, name: str = "") -> Any:
    return expect(kind, value, path, TOML_NAMES, name)


def _did_you_mean(unknown: list[str], known: Iterable[str]) -> str:
    close = {key: difflib.get_close_matches(key, list(known), n=1) for key in unknown}
    hints = [f"{match[0]!r}" + (f" for {key!r}" if len(unknown) > 1 else "") for key, match in close.items() if match]
    return f"did you mean {', '.join(hints)}? " if hints else ""


def _close_to(value: object, allowed: tuple[object, ...]) -> str:
    """`(did you mean 'fp16'?)` where a string is close to one allowed string."""
    if not isinstance(value, str):
        return ""
    match = difflib.get_close_matches(value, [str(option) for option in allowed if isinstance(option, str)], n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _key(key: str) -> str:
    """A table key as TOML writes it in a dotted path: bare if it can be, else quoted (`revisions."org/x"`)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _quoted(names: list[str]) -> str:
    return ", ".join(f"'{name}'" for name in names)
