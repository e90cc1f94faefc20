"""One validation vocabulary for options and arguments.

Each check takes the value and the name to show (`"agent option 'max_steps'"`, `"timeout"`),
returns the value (normalized where that helps: seconds come back as a float) and raises
`ConfigError` naming both when it is malformed. A bool is never a number here, although Python
makes it an int. `error=` picks another `CmdcError` for data that is not an option (a message,
a serialized state).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from .errors import ConfigError

if TYPE_CHECKING:
    import attrs

T = TypeVar("T")


def is_int(value: object) -> TypeGuard[int]:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """An int or a float, not a bool (NaN and the infinities included)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def integer(value: object, name: str, *, minimum: int | None = 1, error: type[Exception] = ConfigError) -> int:
    """An int (not a bool) of at least `minimum` (None: any)."""
    if not is_int(value) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise error(f"{name} must be an integer{bound}, got {value!r:.80}")
    return value


def optional_integer(value: object, name: str, *, minimum: int = 1) -> int | None:
    """None, or `integer(value, name, minimum=minimum)`."""
    if value is None:
        return None
    if not is_int(value) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum} or None, got {value!r:.80}")
    return value


def seconds(value: object, name: str, *, zero: bool = False) -> float:
    """A finite number of seconds: positive, or >= 0 with `zero`."""
    if not is_number(value) or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        what = "a finite number of seconds >= 0" if zero else "a positive, finite number of seconds"
        raise ConfigError(f"{name} must be {what}, got {value!r:.80}")
    return float(value)


def optional_seconds(value: object, name: str) -> float | None:
    """None (no bound), or a positive, finite number of seconds."""
    if value is None:
        return None
    if not is_number(value) or not 0 < value < math.inf:
        raise ConfigError(f"{name} must be a positive, finite number of seconds or None, got {value!r:.80}")
    return float(value)


def number_in(value: object, name: str, low: float, high: float) -> float:
    """A number in the closed interval [low, high]."""
    if not is_number(value) or not low <= value <= high:
        raise ConfigError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r:.80}")
    return float(value)


def flag(value: object, name: str, *, error: type[Exception] = ConfigError) -> bool:
    """True or False (not 0, 1 or None)."""
    if not isinstance(value, bool):
        raise error(f"{name} must be True or False, got {value!r:.80}")
    return value


def choice(value: T, name: str, options: Collection[T]) -> T:
    """One of `options` (equal and of the same type: a bool is never taken for 0 or 1)."""
    if not any(type(o) is type(value) and o == value for o in options):
        listed = ", ".join(repr(o) for o in options)
        raise ConfigError(f"{name} must be one of {listed}, got {value!r:.80}")
    return value


def known_names(given: Collection[str], known: Collection[str], what: str) -> None:
    """Refuse keyword names outside `known` (from a caller no type checker saw): a `ConfigError`
    naming them, the closest known name to each, and every known one."""
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    close = [m for name in unknown for m in difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)]
    hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    raise ConfigError(f"unknown {what}(s) {unknown}{hint}; {what}s are {sorted(known)}")


def text(value: object, name: str, *, blank: bool = True) -> str:
    """A non-empty string (and not only white space, unless `blank`)."""
    if not isinstance(value, str) or not (value if blank else value.strip()):
        raise ConfigError(f"{name} must be a non-empty string, got {value!r:.80}")
    return value


def function(value: object, name: str) -> Callable[..., Any]:
    """Something callable."""
    if not callable(value):
        raise ConfigError(f"{name} must be callable, got {value!r:.80}")
    return value


def validator(
    check: Callable[..., object], name: str, **options: Any
) -> Callable[[object, attrs.Attribute[Any], object], None]:
    """`check` as an attrs field validator; `name` is formatted with the field's name
    (`validator(integer, "agent option {!r}", minimum=0)`)."""

    def validate(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        check(value, name.format(attribute.name), **options)

    return validate
