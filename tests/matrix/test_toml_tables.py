"""The TOML table reader (matrix/toml_tables.py): every refusal names the file, the entry and the field."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from packaging.version import Version

from matrix.toml_tables import NOT_IN_FILE, TableError, read_table, written_as

WHERE = "fruit.toml: entry [fruit.apple]"


class FruitError(ValueError):
    pass


@dataclass(frozen=True)
class Seed:
    count: int
    kind: Literal["pip", "stone"] = "pip"


@dataclass(frozen=True)
class Fruit:
    name: str
    colour: str
    weight: float = 1.0
    ripe: bool = False
    season: Literal["spring", "autumn"] = "autumn"
    stages: Literal[0, 1, 2] = 0
    tags: tuple[str, ...] = ()
    seeds: tuple[Seed, ...] = ()
    prices: dict[Literal["eu", "us"], float] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    origin: str | None = None
    since: Version | None = None
    planted: Version | None = field(default=None, metadata=written_as('a quoted release: planted = "1.0"'))
    grown_by_code: str = field(default="", metadata=NOT_IN_FILE)

    def validate(self) -> None:
        if self.ripe and self.season == "spring":
            raise TableError("season", "must be 'autumn' for a ripe fruit")


def read(raw: object, **kwargs: Any) -> Fruit:
    return read_table(Fruit, raw, where=WHERE, error=FruitError, given={"name": "apple"}, **kwargs)


def test_a_table_becomes_its_dataclass_by_the_type_hints():
    fruit = read(
        {
            "colour": "red",
            "weight": 2,
            "ripe": True,
            "stages": 2,
            "tags": ["sweet"],
            "seeds": [{"count": 5}, {"count": 1, "kind": "stone"}],
            "prices": {"eu": 1.5},
            "notes": {"any": [1, "thing"]},
            "origin": "kent",
            "since": "1.2",
        }
    )
    assert fruit == Fruit(
        name="apple",
        colour="red",
        weight=2.0,
        ripe=True,
        stages=2,
        tags=("sweet",),
        seeds=(Seed(5), Seed(1, "stone")),
        prices={"eu": 1.5},
        notes={"any": [1, "thing"]},
        origin="kent",
        since=Version("1.2"),
    )
    assert isinstance(fruit.weight, float) and read({"colour": "red"}).origin is None


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"colour": 3}, "field 'colour' must be a string, got 3"),
        ({"colour": "red", "ripe": "yes"}, "field 'ripe' must be true or false, got 'yes'"),
        ({"colour": "red", "weight": True}, "field 'weight' must be a number, got True"),
        ({"colour": "red", "tags": "sweet"}, "field 'tags' must be an array, got 'sweet'"),
        ({"colour": "red", "tags": ["sweet", 4]}, "field 'tags[1]' must be a string, got 4"),
        ({"colour": "red", "seeds": [{"count": 1.5}]}, "field 'seeds[0].count' must be an integer, got 1.5"),
        ({"colour": "red", "notes": []}, "field 'notes' must be a table, got []"),
        ({"colour": "red", "prices": {"eu": "cheap"}}, "field 'prices.eu' must be a number, got 'cheap'"),
        ({"colour": "red", "since": "x"}, "field 'since' must be a Version (Invalid version: 'x'), got 'x'"),
        ({"colour": "red", "since": 1.2}, "field 'since' must be a string, got 1.2"),
        ("red", "must be a table, got 'red'"),
    ],
)
def test_a_wrong_type_names_the_file_entry_and_field(raw, message):
    with pytest.raises(FruitError, match=f"^{re.escape(f'{WHERE} {message}')}$"):
        read(raw)


@pytest.mark.parametrize(
    "raw, message",
    [
        (
            {"colour": "red", "colur": "green"},
            "has unknown field(s) ['colur']; did you mean 'colour'? known fields: ['colour', 'notes', 'origin', "
            "'planted', "
            "'prices', 'ripe', 'season', 'seeds', 'since', 'stages', 'tags', 'weight']",
        ),
        (
            {"colour": "red", "tag": [], "wieght": 2},
            "has unknown field(s) ['tag', 'wieght']; did you mean 'tags' for 'tag', 'weight' for 'wieght'? known "
            "fields:",
        ),
        ({"colour": "red", "name": "pear"}, "has unknown field(s) ['name']; known fields:"),  # given by the caller
        ({"colour": "red", "grown_by_code": "x"}, "has unknown field(s) ['grown_by_code']; known fields:"),
        (
            {"colour": "red", "seeds": [{"count": 1, "knd": "pip"}]},
            "field 'seeds[0]' has unknown field(s) ['knd']; did you mean 'kind'? known fields: ['count', 'kind']",
        ),
        (
            {"colour": "red", "prices": {"eur": 1}},
            "field 'prices' has unknown key 'eur' (did you mean 'eu'?); use one of ('eu', 'us')",
        ),
    ],
)
def test_an_unknown_key_is_refused_with_the_closest_field(raw, message):
    with pytest.raises(FruitError, match=f"^{re.escape(f'{WHERE} {message}')}"):
        read(raw)


@pytest.mark.parametrize(
    "raw, message",
    [
        (
            {"colour": "red", "season": "sprng"},
            "field 'season' must be one of ('spring', 'autumn'), got 'sprng' (did you mean 'spring'?)",
        ),
        ({"colour": "red", "stages": 3}, "field 'stages' must be one of (0, 1, 2), got 3"),
        ({"colour": "red", "stages": True}, "field 'stages' must be one of (0, 1, 2), got True"),  # true is no 1
        (
            {"colour": "red", "seeds": [{"count": 1, "kind": "core"}]},
            "field 'seeds[0].kind' must be one of ('pip', 'stone'), got 'core'",
        ),
    ],
)
def test_a_value_outside_its_literal_is_refused_naming_the_allowed_ones(raw, message):
    with pytest.raises(FruitError, match=f"^{re.escape(f'{WHERE} {message}')}$"):
        read(raw)


@pytest.mark.parametrize(
    "raw, message",
    [
        ({}, "is missing required field 'colour'"),
        ({"colour": "red", "seeds": [{}]}, "field 'seeds[0]' is missing required field 'count'"),
    ],
)
def test_a_missing_required_field_is_named(raw, message):
    with pytest.raises(FruitError, match=f"^{re.escape(f'{WHERE} {message}')}$"):
        read(raw)


def test_cross_field_rules_of_the_class_and_of_the_caller_name_the_field():
    with pytest.raises(FruitError, match=f"^{re.escape(WHERE)} field 'season' must be 'autumn' for a ripe fruit$"):
        read({"colour": "red", "ripe": True, "season": "spring"})

    def red_only(fruit: Fruit) -> None:
        if fruit.colour != "red":
            raise TableError("colour", f"must be 'red' in this file, got {fruit.colour!r}")

    with pytest.raises(
        FruitError, match=f"^{re.escape(WHERE)} field 'colour' must be 'red' in this file, got 'green'$"
    ):
        read({"colour": "green"}, rules=red_only)
    assert read({"colour": "red"}, rules=red_only).colour == "red"


def test_a_nested_tables_rule_is_named_from_the_outer_table():
    @dataclass(frozen=True)
    class Basket:
        fruit: tuple[Fruit, ...]

    with pytest.raises(FruitError, match=re.escape("field 'fruit[1].season' must be 'autumn' for a ripe fruit")):
        read_table(
            Basket,
            {
                "fruit": [
                    {"name": "a", "colour": "red"},
                    {"name": "b", "colour": "red", "ripe": True, "season": "spring"},
                ]
            },
            where=WHERE,
            error=FruitError,
        )


def test_a_dataclass_built_in_code_is_not_validated():
    assert Fruit(name="apple", colour="red", ripe=True, season="spring").season == "spring"


def test_a_field_that_says_how_to_write_it_says_so_in_its_type_message():
    with pytest.raises(FruitError) as refused:
        read({"colour": "red", "planted": 1.0})
    assert str(refused.value) == (
        f"{WHERE} field 'planted' must be a string, got 1.0; write it as a quoted release: planted = \"1.0\""
    )
    with pytest.raises(FruitError, match=r"field 'origin' must be a string, got 3$"):
        read({"colour": "red", "origin": 3})
