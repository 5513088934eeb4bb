"""One reader for the typed records that come back as JSON (a rank's job and error files, a cell's outcome, its
cause, break point and AutoTP record in cells.jsonl and the store, report.json's parts): an object becomes a
dataclass by the class's own fields and type hints, so a record's shape is written once, on the class. Other
processes and older runs wrote these files, so one that does not fit is refused whole, the message naming the record,
the field's path and what was there, never half read into a record that fails later somewhere else.

What a field's hint accepts:
- `str`, `int`, `bool` as they are (true is no 1); `float` a number (an integer kept as it is, which a float field
  holds for the type checker too, so a record read and written again is the same text);
- `Literal[...]`: one of its values, of the same type;
- `X | None`: null or X; a union of several types: the first that reads;
- `tuple[X, ...]` and `list[X]`: a list of X; `tuple[X, Y]`: a list of that length; `dict[str, X]`: an object of X;
- a dataclass: a nested object read by the same rules (or an instance of it that a reshaping built already);
- `Any`: anything, as it is; any other class: an instance of it (a tensor in a `torch.load`ed record).
A field left out takes its default (files from before the field was added); one without a default is required.

A record whose JSON is not the shape of its fields (report.json flattens some records into their parent) says how
to get that shape back with a static method `own_shape(json) -> dict`, which the reader calls wherever it meets the
class, nested or not, before reading the fields.

`write_record` is the reader's inverse, the one way a record becomes JSON: a dataclass an object of its fields in
their order (each written by the same rules), a tuple or list a list, a dict an object, anything else as it is (text,
numbers, None; a tensor for torch.save). A record with an `own_shape` has the inverse beside it, a method
`json_shape(self, written) -> dict` that the writer calls on the object of its written fields; `read_record(cls,
write_record(record)) == record` for every record (tests/matrix/test_json_records.py walks the packages for them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from functools import cache, partial
from types import NoneType, UnionType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union, cast, get_args, get_origin, get_type_hints

from matrix.hinted_fields import FieldError, expect, init_fields, join

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Record = TypeVar("Record", bound="DataclassInstance")

Read = Callable[[object, str], Any]
"""A value read by one hint: (the JSON value, its field path) → the typed value."""

JSON_NAMES: dict[type, str] = {str: "a string", int: "an integer", bool: "true or false", dict: "an object"}


class RecordError(ValueError):
    """A JSON value that does not fit its record: the message names the record class, the field's path and what
    was found."""


def write_record(record: DataclassInstance) -> dict[str, Any]:
    """`record` as JSON: what json.dumps writes and read_record reads back as the same record (module docstring)."""
    return cast(dict[str, Any], _write(record))


def _write(value: object) -> object:
    if isinstance(value, (str, int, float, NoneType)):
        return value
    if isinstance(value, (tuple, list)):
        return [_write(item) for item in value]
    if isinstance(value, dict):
        return {key: _write(item) for key, item in value.items()}
    if is_dataclass(value) and not isinstance(value, type):
        written = {name: _write(getattr(value, name)) for name in _field_names(type(value))}
        json_shape: Callable[[dict[str, Any]], dict[str, Any]] | None = getattr(value, "json_shape", None)
        return written if json_shape is None else json_shape(written)
    return value


@cache
def _field_names(cls: type[DataclassInstance]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def read_record(cls: type[Record], data: object) -> Record:
    """`data` (what json.loads gave) as a `cls`, by the rules of this module's docstring."""
    try:
        return cast(Record, _read_dataclass(cls, data, ""))
    except FieldError as misfit:
        raise RecordError(f"{cls.__name__}: {misfit}") from None


@cache
def _fields_of(cls: type[DataclassInstance]) -> tuple[dict[str, Read], frozenset[str]]:
    """Each field's reader, and the fields without a default."""
    hints = get_type_hints(cls)
    init, required = init_fields(cls)
    return {name: _reader(hints[name]) for name in init}, required


def _read_dataclass(cls: type[DataclassInstance], value: object, path: str) -> object:
    if isinstance(value, cls):
        return value
    own_shape: Callable[[dict[str, Any]], dict[str, Any]] | None = getattr(cls, "own_shape", None)
    data = _expect(dict, value, path)
    if own_shape is not None:
        try:
            data = own_shape(data)
        except KeyError as key:  # a key the flattened form must have
            raise FieldError(path, f"is missing required field {key}") from None
    readers, required = _fields_of(cls)
    if unknown := sorted(set(data) - set(readers)):
        raise FieldError(path, f"has unknown field(s) {unknown}; {cls.__name__}'s fields: {sorted(readers)}")
    if missing := sorted(required - set(data)):
        raise FieldError(path, f"is missing required field(s) {missing}")
    return cls(**{name: readers[name](item, join(path, name)) for name, item in data.items()})


@cache
def _reader(hint: Any) -> Read:
    """The reader of one hint, built once per hint: a store holds thousands of records of a few types."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return _as_is
    if origin is Literal:
        return partial(_literal, args)
    if origin in (Union, UnionType):
        return partial(_union, NoneType in args, tuple(_reader(arg) for arg in args if arg is not NoneType))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return partial(_tuple_of, _reader(args[0]))
        return partial(_fixed_tuple, tuple(_reader(arg) for arg in args))
    if origin is list:
        return partial(_list_of, _reader(args[0]))
    if origin is dict:
        if args[0] is not str:
            raise TypeError(f"a JSON object's keys are strings, not {args[0]} ({hint})")
        return partial(_dict_of, _reader(args[1]))
    if isinstance(hint, type) and is_dataclass(hint):
        return partial(_read_dataclass, hint)
    if hint is float:
        return _number
    if hint in JSON_NAMES:
        return partial(_expect, hint)
    return partial(_instance, hint)


def _as_is(value: object, path: str) -> object:
    return value


def _literal(allowed: tuple[object, ...], value: object, path: str) -> object:
    if not any(type(value) is type(option) and value == option for option in allowed):
        raise FieldError(path, f"must be one of {allowed}, got {value!r}")
    return value


def _union(nullable: bool, options: tuple[Read, ...], value: object, path: str) -> object:
    if value is None and nullable:
        return None
    for option in options[:-1]:
        try:
            return option(value, path)
        except FieldError:
            continue
    return options[-1](value, path)  # the last option's message says what was wrong


def _tuple_of(item: Read, value: object, path: str) -> tuple[object, ...]:
    return tuple(item(entry, f"{path}[{index}]") for index, entry in enumerate(_sequence(value, path)))


def _list_of(item: Read, value: object, path: str) -> list[object]:
    return list(_tuple_of(item, value, path))


def _fixed_tuple(items: tuple[Read, ...], value: object, path: str) -> tuple[object, ...]:
    entries = _sequence(value, path)
    if len(entries) != len(items):
        raise FieldError(path, f"must be a list of {len(items)}, got {value!r}")
    return tuple(item(entry, f"{path}[{index}]") for index, (item, entry) in enumerate(zip(items, entries)))


def _dict_of(item: Read, value: object, path: str) -> dict[str, object]:
    return {key: item(entry, join(path, key)) for key, entry in _expect(dict, value, path).items()}


def _number(value: object, path: str) -> object:
    if type(value) not in (int, float):
        raise FieldError(path, f"must be a number, got {value!r}")
    return value


def _instance(kind: type, value: object, path: str) -> object:
    if not isinstance(value, kind):
        raise FieldError(path, f"must be an instance of {kind.__name__}, got {value!r}")
    return value


def _sequence(value: object, path: str) -> list[object] | tuple[object, ...]:
    """A JSON list (or a tuple, where a reshaping or torch.load gave one)."""
    if not isinstance(value, (list, tuple)):
        raise FieldError(path, f"must be a list, got {value!r}")
    return value


def _expect(kind: type, value: object, path: str) -> Any:
    return expect(kind, value, path, JSON_NAMES)


def split_keys(data: Mapping[str, Any], names: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the keys `names` of a flattened object, the rest): the two parts an `own_shape` sets apart again."""
    return {name: data[name] for name in names}, {key: item for key, item in data.items() if key not in names}


def renamed(data: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """`data` with the keys `names` maps renamed, in their places: a field stored under another name than the one it
    has in Python (`json_shape` renames to the stored name, `own_shape` back)."""
    return {names.get(key, key): item for key, item in data.items()}
