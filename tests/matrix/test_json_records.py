"""matrix/json_records.py: a JSON object read into a dataclass by its type hints, and what does not fit refused with
the record, the field's path and what was found."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import pytest

from matrix.json_records import RecordError, read_record, split_keys


@dataclass(frozen=True)
class Point:
    name: str
    count: int
    ratio: float
    on: bool


@dataclass(frozen=True)
class Shapes:
    pairs: tuple[tuple[str, str], ...]
    fixed: tuple[str, int]
    names: list[str]
    by_name: dict[str, Point]
    nested: dict[str, dict[str, int]]


@dataclass(frozen=True)
class Choices:
    dtype: Literal["fp32", "bf16"]
    stage: Literal[0, 1]
    kind: Literal["broke", "fixed"] | Literal[""]
    maybe: Point | None
    either: int | str
    anything: Any


@dataclass(frozen=True)
class WithDefaults:
    required: str
    note: str = ""
    tags: tuple[str, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)
    point: Point | None = None


@dataclass(frozen=True)
class Flattened:
    """Its JSON puts the point's fields at its own top level (as report.json does with a cell's key)."""

    label: str
    point: Point

    @staticmethod
    def own_shape(entry: dict[str, Any]) -> dict[str, Any]:
        point, rest = split_keys(entry, ("name", "count", "ratio", "on"))
        return {**rest, "point": point}


@dataclass(frozen=True)
class Holder:
    items: tuple[Flattened, ...]


class Opaque:
    """A class JSON has no form of (a tensor in a torch.load'ed record)."""


@dataclass(frozen=True)
class WithOpaque:
    value: Opaque


POINT = {"name": "a", "count": 2, "ratio": 0.5, "on": True}


def refused(cls: type, data: object, message: str) -> None:
    with pytest.raises(RecordError, match=re.escape(message)):
        read_record(cls, data)


def test_primitives_are_read_as_they_are() -> None:
    assert read_record(Point, POINT) == Point("a", 2, 0.5, True)
    # A float field takes an integer and keeps it: a record read and written again is the same text.
    point = read_record(Point, {**POINT, "ratio": 3})
    assert point.ratio == 3 and type(point.ratio) is int
    assert json.dumps(asdict(point)) == json.dumps({**POINT, "ratio": 3})


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        ({"name": 1}, "Point: field 'name' must be a string, got 1"),
        ({"count": "2"}, "Point: field 'count' must be an integer, got '2'"),
        ({"count": True}, "Point: field 'count' must be an integer, got True"),  # bool subclasses int: still refused
        ({"count": 2.0}, "Point: field 'count' must be an integer, got 2.0"),
        ({"ratio": "0.5"}, "Point: field 'ratio' must be a number, got '0.5'"),
        ({"ratio": False}, "Point: field 'ratio' must be a number, got False"),
        ({"on": 1}, "Point: field 'on' must be true or false, got 1"),
    ],
)
def test_a_primitive_of_the_wrong_type_is_refused(changed: dict[str, object], message: str) -> None:
    refused(Point, {**POINT, **changed}, message)


def test_containers_become_tuples_lists_and_dicts_of_their_hints() -> None:
    shapes = read_record(
        Shapes,
        {
            "pairs": [["transformers", "5.24.0"], ["torch", "2.13.0"]],
            "fixed": ["x", 3],
            "names": ["a", "b"],
            "by_name": {"p": POINT},
            "nested": {"pass": {"tp2": 1}},
        },
    )
    assert shapes.pairs == (("transformers", "5.24.0"), ("torch", "2.13.0"))
    assert type(shapes.pairs) is tuple and all(type(pair) is tuple for pair in shapes.pairs)
    assert shapes.fixed == ("x", 3) and type(shapes.fixed) is tuple
    assert shapes.names == ["a", "b"] and type(shapes.names) is list
    assert shapes.by_name == {"p": Point("a", 2, 0.5, True)}
    assert shapes.nested == {"pass": {"tp2": 1}}


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        ({"pairs": [["torch"]]}, "Shapes: field 'pairs[0]' must be a list of 2, got ['torch']"),
        ({"pairs": [["torch", 2]]}, "Shapes: field 'pairs[0][1]' must be a string, got 2"),
        ({"fixed": "x3"}, "Shapes: field 'fixed' must be a list, got 'x3'"),
        ({"names": ["a", None]}, "Shapes: field 'names[1]' must be a string, got None"),
        ({"by_name": {"p": {**POINT, "count": "2"}}}, "Shapes: field 'by_name.p.count' must be an integer, got '2'"),
        ({"by_name": ["p"]}, "Shapes: field 'by_name' must be an object, got ['p']"),
        ({"nested": {"pass": {"tp2": 1.5}}}, "Shapes: field 'nested.pass.tp2' must be an integer, got 1.5"),
    ],
)
def test_a_container_is_refused_at_the_path_of_what_does_not_fit(changed: dict[str, object], message: str) -> None:
    good = {"pairs": [], "fixed": ["x", 3], "names": [], "by_name": {}, "nested": {}}
    refused(Shapes, {**good, **changed}, message)


CHOICES = {"dtype": "bf16", "stage": 1, "kind": "", "maybe": None, "either": "x", "anything": {"k": [1]}}


def test_literals_unions_and_any() -> None:
    assert read_record(Choices, CHOICES) == Choices("bf16", 1, "", None, "x", {"k": [1]})
    read = read_record(Choices, {**CHOICES, "kind": "broke", "maybe": POINT, "either": 3})
    assert (read.kind, read.maybe, read.either) == ("broke", Point("a", 2, 0.5, True), 3)


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        ({"dtype": "fp16"}, "Choices: field 'dtype' must be one of ('fp32', 'bf16'), got 'fp16'"),
        ({"stage": True}, "Choices: field 'stage' must be one of (0, 1), got True"),  # True == 1, but no stage
        ({"kind": "gone"}, "Choices: field 'kind' must be one of ('',), got 'gone'"),
        ({"maybe": {**POINT, "on": "yes"}}, "Choices: field 'maybe.on' must be true or false, got 'yes'"),
        ({"either": 1.5}, "Choices: field 'either' must be a string, got 1.5"),
        ({"dtype": None}, "Choices: field 'dtype' must be one of ('fp32', 'bf16'), got None"),
    ],
)
def test_a_value_no_literal_or_union_member_takes_is_refused(changed: dict[str, object], message: str) -> None:
    refused(Choices, {**CHOICES, **changed}, message)


def test_a_field_left_out_takes_its_default() -> None:
    read = read_record(WithDefaults, {"required": "r"})
    assert read == WithDefaults("r", "", (), {}, None)
    assert read_record(WithDefaults, {"required": "r", "tags": ["t"], "metrics": {"m": 1.5}}).tags == ("t",)


def test_a_required_field_left_out_is_refused() -> None:
    refused(WithDefaults, {"note": "n"}, "WithDefaults: is missing required field(s) ['required']")
    refused(Holder, {"items": [{"label": "l"}]}, "Holder: field 'items[0]' is missing required field 'name'")
    refused(Flattened, {**POINT}, "Flattened: is missing required field(s) ['label']")


def test_an_unknown_key_is_refused_with_its_path() -> None:
    refused(WithDefaults, {"required": "r", "notes": ""}, "WithDefaults: has unknown field(s) ['notes']")
    refused(
        Shapes,
        {"pairs": [], "fixed": ["x", 1], "names": [], "by_name": {"p": {**POINT, "colour": "red"}}, "nested": {}},
        "Shapes: field 'by_name.p' has unknown field(s) ['colour']",
    )


def test_a_record_that_is_no_object_is_refused() -> None:
    refused(Point, ["a", 2, 0.5, True], "Point: must be an object, got ['a', 2, 0.5, True]")


def test_own_shape_puts_a_flattened_record_back_wherever_the_class_stands() -> None:
    entry = {"label": "l", **POINT}
    assert read_record(Flattened, entry) == Flattened("l", Point("a", 2, 0.5, True))
    assert read_record(Holder, {"items": [entry, entry]}).items == (Flattened("l", Point("a", 2, 0.5, True)),) * 2
    refused(Holder, {"items": [{**entry, "count": None}]}, "Holder: field 'items[0].point.count' must be an integer")


def test_an_instance_a_reshaping_built_is_taken_as_it_is() -> None:
    point = Point("a", 2, 0.5, True)
    assert read_record(WithDefaults, {"required": "r", "point": point}).point is point
    assert read_record(Point, point) is point


def test_any_other_class_takes_an_instance_of_it() -> None:
    value = Opaque()
    assert read_record(WithOpaque, {"value": value}).value is value
    refused(WithOpaque, {"value": "opaque"}, "WithOpaque: field 'value' must be an instance of Opaque, got 'opaque'")


def test_refusals_are_value_errors() -> None:
    """Readers of JUnit files catch ValueError around the records they read (reports/store/junit.py)."""
    assert issubclass(RecordError, ValueError)


def test_split_keys() -> None:
    assert split_keys({"a": 1, "b": 2, "c": 3}, ("a", "c")) == ({"a": 1, "c": 3}, {"b": 2})
