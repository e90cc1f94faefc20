"""The validation vocabulary (`cmdc._check`): each check takes what it should, refuses the rest
with `ConfigError` naming the option and the value, and a bool is never a number."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest

from cmdc import ConfigError
from cmdc._check import (
    choice,
    flag,
    function,
    integer,
    is_int,
    is_number,
    number_in,
    optional_integer,
    optional_seconds,
    seconds,
    text,
    validator,
)
from cmdc.errors import InvalidState

HOSTILE: list[Any] = [True, False, None, "5", b"5", [5], 2.0, math.nan, math.inf, -math.inf, object()]


def test_predicates_take_numbers_but_not_bools() -> None:
    assert is_int(0) and is_int(-(2**70)) and not is_int(True) and not is_int(1.0) and not is_int("1")
    assert is_number(1) and is_number(0.5) and is_number(math.nan)
    assert not is_number(False) and not is_number("1") and not is_number(None)


@pytest.mark.parametrize("bad", [*HOSTILE, 0, -1])
def test_integer_refuses_naming_the_option_and_the_value(bad: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        integer(bad, "agent option 'max_steps'")
    assert "agent option 'max_steps' must be an integer >= 1" in str(caught.value)
    assert repr(bad)[:40] in str(caught.value)


def test_integer_bounds_and_error_class() -> None:
    assert integer(1, "n") == 1 and integer(0, "n", minimum=0) == 0 and integer(-5, "seed", minimum=None) == -5
    with pytest.raises(ConfigError, match=r"seed must be an integer, got True"):
        integer(True, "seed", minimum=None)
    with pytest.raises(InvalidState, match="compactions must be an integer >= 0, got -1"):
        integer(-1, "compactions", minimum=0, error=InvalidState)
    assert optional_integer(None, "n") is None and optional_integer(3, "n") == 3
    with pytest.raises(ConfigError, match=r"n must be an integer >= 1 or None, got 0"):
        optional_integer(0, "n")


@pytest.mark.parametrize("bad", [*[h for h in HOSTILE if h is not None and h != 2.0], 0, -1.5])
def test_seconds_are_positive_and_finite(bad: Any) -> None:
    with pytest.raises(ConfigError, match="timeout must be a positive, finite number of seconds"):
        seconds(bad, "timeout")
    with pytest.raises(ConfigError, match="timeout must be a positive, finite number of seconds or None"):
        optional_seconds(bad, "timeout")


def test_seconds_come_back_as_floats() -> None:
    assert seconds(2, "t") == 2.0 and type(seconds(2, "t")) is float
    assert seconds(0, "delay", zero=True) == 0.0 and optional_seconds(None, "t") is None
    with pytest.raises(ConfigError, match="delay must be a finite number of seconds >= 0, got -1"):
        seconds(-1, "delay", zero=True)
    with pytest.raises(ConfigError, match="t must be a positive, finite number of seconds, got None"):
        seconds(None, "t")


def test_number_in_a_closed_interval() -> None:
    assert number_in(0, "p", 0, 1) == 0.0 and number_in(1, "p", 0, 1) == 1.0
    for bad in (True, -0.01, 1.01, math.nan, "0.5"):
        with pytest.raises(ConfigError, match=r"p must be a number in \[0, 1\]"):
            number_in(bad, "p", 0, 1)


def test_flag_choice_text_function() -> None:
    assert flag(False, "stream") is False
    for bad in (0, 1, None, "true"):
        with pytest.raises(ConfigError, match="stream must be True or False"):
            flag(bad, "stream")
    assert choice("require", "resume", (False, True, "require")) == "require"
    assert choice(True, "resume", (False, True, "require")) is True
    for bad in (1, 0, "maybe", None):  # 1 == True, but an int is not a bool
        with pytest.raises(ConfigError, match="resume must be one of False, True, 'require'"):
            choice(bad, "resume", (False, True, "require"))
    assert text(" ", "model") == " "
    for bad in ("", None, 3, b"x"):
        with pytest.raises(ConfigError, match="model must be a non-empty string"):
            text(bad, "model")
    with pytest.raises(ConfigError, match="instructions must be a non-empty string"):
        text(" \n", "instructions", blank=False)
    assert function(len, "f") is len
    with pytest.raises(ConfigError, match="f must be callable, got 3"):
        function(3, "f")


def test_a_long_value_is_clipped_in_the_message() -> None:
    with pytest.raises(ConfigError) as caught:
        integer("x" * 10_000, "n")
    assert len(str(caught.value)) < 200


def test_validator_names_the_field() -> None:
    @attrs.frozen
    class Options:
        depth: int = attrs.field(default=1, validator=validator(integer, "option {!r}", minimum=0))

    assert Options(0).depth == 0
    with pytest.raises(ConfigError, match=r"option 'depth' must be an integer >= 0, got -1"):
        Options(-1)
