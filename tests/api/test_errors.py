"""One error hierarchy: every public exception class cmdc defines lives in `cmdc.errors` and
derives from `CmdcError`; the modules that used to define one still export it."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

import cmdc
from cmdc import errors


def _modules() -> list[ModuleType]:
    found = [cmdc]
    for info in pkgutil.walk_packages(cmdc.__path__, "cmdc."):
        if info.name == "cmdc.__main__":  # runs the command
            continue
        try:
            found.append(importlib.import_module(info.name))
        except ImportError as exc:  # an optional extra that is not installed
            if exc.name is None or exc.name.startswith("cmdc"):
                raise
    return found


def test_every_public_exception_class_is_defined_in_errors() -> None:
    elsewhere = [
        f"{cls.__module__}.{name}"
        for module in _modules()
        for name, cls in vars(module).items()
        if inspect.isclass(cls)
        and issubclass(cls, BaseException)
        and cls.__module__ == module.__name__
        and module is not errors
        and not name.startswith("_")
    ]
    assert elsewhere == []


def test_every_error_derives_from_cmdc_error() -> None:
    classes = [c for c in vars(errors).values() if inspect.isclass(c) and c.__module__ == "cmdc.errors"]
    assert len(classes) > 30
    assert all(issubclass(c, errors.CmdcError) for c in classes if not issubclass(c, Warning))
    assert all(issubclass(c, DeprecationWarning) for c in classes if issubclass(c, Warning))


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("cmdc.tools", "ToolArgumentsError"),
        ("cmdc.plugins", "PluginReturnError"),
        ("cmdc.cli._chatfile", "ChatFileError"),
        ("cmdc.cli._demo", "DemoError"),
        ("cmdc.cli", "UsageError"),
    ],
)
def test_old_homes_still_export_the_moved_errors(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is getattr(errors, name)


def test_moved_errors_keep_their_builtin_bases() -> None:
    # code that caught the builtin base before still catches them
    assert issubclass(errors.ToolArgumentsError, ValueError)
    assert issubclass(errors.PluginReturnError, TypeError)
    assert issubclass(errors.InvalidPlugin, TypeError) and issubclass(errors.InvalidPlugin, errors.ConfigError)


def test_a_non_plugin_is_refused_as_a_config_error_and_a_type_error() -> None:
    with pytest.raises(errors.InvalidPlugin, match=r"plugins must subclass cmdc\.Plugin, got str"):
        cmdc.Compactor(plugins=["not a plugin"])  # type: ignore[list-item]


def test_errors_with_fields_survive_pickling() -> None:
    tool = pickle.loads(pickle.dumps(errors.ToolArgumentsError(["a: missing", "b: not an integer"], tool="t")))
    assert tool.errors == ("a: missing", "b: not an integer") and tool.tool == "t"
    assert "invalid arguments for tool 't'" in str(tool)
    chat = errors.ChatFileError(Path("c.jsonl"), "not valid JSON", line=3)
    assert str(chat) == "c.jsonl:3: not valid JSON" and chat.line == 3 and chat.problem == "not valid JSON"


def _drawn_tree() -> dict[str, tuple[str | None, set[str]]]:
    """The tree in `cmdc.errors`' docstring: each class name -> (the class it is drawn under,
    the other bases its `(also ...)` names)."""
    doc = errors.__doc__ or ""
    drawn: dict[str, tuple[str | None, set[str]]] = {}
    stack: list[str] = []
    for line in doc.splitlines():
        if not line.startswith("    ") or not line.strip():
            continue
        body = line[4:]
        marker = max(body.find("├── "), body.find("└── "))
        depth = 0 if marker < 0 else marker // 4 + 1
        label = body if marker < 0 else body[marker + 4 :]
        name, _, rest = label.partition(" ")
        also = rest.removeprefix("(also ").removesuffix(")").split(", ") if rest.startswith("(also ") else []
        del stack[depth:]
        assert name not in drawn, f"{name} drawn twice"
        drawn[name] = (stack[-1] if stack else None, set(also))
        stack.append(name)
    return drawn


def test_every_error_is_exported_and_drawn_under_its_bases() -> None:
    """Every class in `cmdc.errors` is in `errors.__all__`, exported from `cmdc` as the same
    object, and drawn in the docstring's tree under its first base with its other bases named;
    the tree names nothing else."""
    classes = {n: c for n, c in vars(errors).items() if inspect.isclass(c) and c.__module__ == "cmdc.errors"}
    assert sorted(errors.__all__) == sorted(classes)
    for name, cls in classes.items():
        assert name in cmdc.__all__ and getattr(cmdc, name) is cls, name
    drawn = _drawn_tree()
    assert set(drawn) - set(classes) == {"DeprecationWarning"}
    for name, cls in classes.items():
        assert name in drawn, f"{name} is not drawn in cmdc.errors' docstring"
        parent, also = drawn[name]
        bases = [b.__name__ for b in cls.__bases__]
        if cls is errors.CmdcError:  # the root, drawn alone
            assert (parent, also, bases) == (None, set(), ["Exception"])
        else:
            assert (parent, also) == (bases[0], set(bases[1:])), name


def test_the_drawing_parser_sees_a_misplaced_class() -> None:
    """The tree check fails on a class drawn under the wrong parent (the parser reads depth)."""
    wrong = (errors.__doc__ or "").replace("    │   │   └── TooManyToolCalls", "    ├── TooManyToolCalls")
    saved = errors.__doc__
    try:
        errors.__doc__ = wrong
        assert _drawn_tree()["TooManyToolCalls"][0] == "CmdcError"
    finally:
        errors.__doc__ = saved
    assert _drawn_tree()["TooManyToolCalls"][0] == "ReplyTooLarge"
