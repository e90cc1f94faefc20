"""Imports go downward or sideways without cycles: the providers (among them the extractive
summarizer) and the stores never import the compaction package, which imports them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "cmdc"
BELOW_COMPACTION = [
    *sorted((ROOT / "providers").glob("*.py")),
    ROOT / "store.py",
    ROOT / "_stores.py",
    ROOT / "offload.py",
]


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (lazy imports in functions included), as
    names relative to the `cmdc` package."""
    package = path.relative_to(ROOT.parent).with_suffix("").parts[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            out.add(module)
            out.update(f"{module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("path", BELOW_COMPACTION, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_of_the_compaction_package(path: Path) -> None:
    assert not [m for m in imported(path) if m == "cmdc.compaction" or m.startswith("cmdc.compaction.")]


def test_the_extractive_summarizer_is_the_same_object_everywhere() -> None:
    import cmdc.compaction
    import cmdc.compaction.summary
    import cmdc.providers
    import cmdc.providers.extractive

    names = {
        cmdc.providers.ExtractiveSummarizer,
        cmdc.providers.extractive.ExtractiveSummarizer,
        cmdc.compaction.ExtractiveSummarizer,
        cmdc.compaction.summary.ExtractiveSummarizer,
    }
    assert len(names) == 1
    assert cmdc.compaction.summary.render_transcript is cmdc.providers.transcript.render_transcript


# docs/design.md's layers. A new module gets its layer here (the test below names any that has none).
LAYERS = {
    0: "message state errors tokens events groups report synthetic _check _clip _frozen _fs _trio _version _search"
    " _bigjson _redact _mcp_reaper",
    1: "plugins compaction providers offload _index _stores store postgres checkpoint tools recall tracing otel mcp"
    " compact_tool rehydrate _mcp_stdio",
    2: "agent runtime bus ray",
    3: "cli _demo _chatfile __init__ __main__ ui",
}
LAYER = {name: layer for layer, names in LAYERS.items() for name in names.split()}


def layer_of(path: Path) -> int:
    """The layer of a module: a package's modules share the package's (`compaction/*`: 1)."""
    first = path.relative_to(ROOT).with_suffix("").parts[0]
    assert first in LAYER, f"cmdc/{path.relative_to(ROOT)} has no layer: add it to LAYERS (see docs/design.md)"
    return LAYER[first]


def runtime_imports(path: Path) -> set[str]:
    """The `cmdc` modules `path` imports when it runs (lazy imports included, imports for type
    checkers only left out), as paths relative to `cmdc`."""
    tree = ast.parse(path.read_text("utf-8"))
    typing_only = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for sub in ast.walk(node)
    }
    package = path.relative_to(ROOT).parts[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level and id(node) not in typing_only:
            base = list(package[: len(package) - node.level + 1])
            module = [*base, *(node.module.split(".") if node.module else [])]
            for name in [None, *(a.name for a in node.names)]:
                parts = module if name is None else [*module, name]
                for candidate in (ROOT.joinpath(*parts).with_suffix(".py"), ROOT.joinpath(*parts, "__init__.py")):
                    if parts and candidate.is_file() and candidate != path:
                        out.add(str(candidate.relative_to(ROOT)))
    return out


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_downward(path: Path) -> None:
    """No module imports one of a higher layer (a package's `__init__` re-exports sideways)."""
    mine = layer_of(path)
    upward = [m for m in runtime_imports(path) if layer_of(ROOT / m) > mine]
    assert not upward, f"layer {mine} imports upward: {upward}"
