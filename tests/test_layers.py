"""Imports go downward or sideways without cycles: the providers (among them the extractive
summarizer) and the stores never import the compaction package, which imports them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "cmdc"
BELOW_COMPACTION = [
    *sorted((ROOT / "providers").glob("*.py")),
    *sorted((ROOT / "store").rglob("*.py")),
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


# DESIGN.md's layers. A new module gets its layer here (the test below names any that has none).
LAYERS = {
    0: "message state errors tokens events groups report synthetic _check _clip _frozen _trio _version _redact"
    " _mcp_reaper",
    # store: the package; offload _index postgres checkpoint _fs _search _bigjson: its old paths
    1: "store offload _index postgres checkpoint _fs _search _bigjson"
    " plugins compaction providers tools recall tracing otel mcp compact_tool rehydrate _mcp_stdio",
    2: "agent runtime bus ray",
    3: "cli _demo _chatfile __init__ __main__ ui",
}
LAYER = {name: layer for layer, names in LAYERS.items() for name in names.split()}


def layer_of(path: Path) -> int:
    """The layer of a module: a package's modules share the package's (`compaction/*`: 1)."""
    first = path.relative_to(ROOT).with_suffix("").parts[0]
    assert first in LAYER, f"cmdc/{path.relative_to(ROOT)} has no layer: add it to LAYERS (see DESIGN.md)"
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


def _package(module: str) -> str:
    """The package a module (a dotted name under `cmdc`) belongs to, for the privacy rule below:
    `cmdc.store.file.journal` -> `cmdc.store.file`, a top-level module -> itself."""
    parts = module.split(".")
    return ".".join(parts[:-1]) if len(parts) > 2 else module


def underscored_imports(path: Path) -> list[str]:
    """`from X import _name` in `path` (lazy imports included) where X is a `cmdc` module of
    another package: an underscored name imported from outside its package."""
    here = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    mine = here.rsplit(".", 1)[0] if path.name != "__init__.py" else here.removesuffix(".__init__")
    package = path.relative_to(ROOT.parent).with_suffix("").parts[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = list(package[: len(package) - node.level + 1]) if node.level else []
        module = ".".join([*base, *(node.module.split(".") if node.module else [])])
        if not module.startswith("cmdc.") or module == mine or module.startswith(mine + "."):
            continue
        if _package(module) == mine:
            continue
        out += [f"{module}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return out


STORE_FILES = sorted((ROOT / "store").rglob("*.py"))


@pytest.mark.parametrize("path", STORE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_store_package_imports_no_other_packages_private_names(path: Path) -> None:
    """DESIGN.md: no module imports another package's underscored names. The store package
    keeps it: the file store, the PostgreSQL store and the shared modules reach each other only
    through public names (`cmdc/_check.py`-style private top-level helpers are modules, not names)."""
    assert not underscored_imports(path)


def test_nothing_outside_the_store_package_imports_its_private_names() -> None:
    found = {
        str(path.relative_to(ROOT)): names
        for path in sorted(ROOT.rglob("*.py"))
        if (ROOT / "store") not in path.parents
        for names in [[n for n in underscored_imports(path) if n.startswith("cmdc.store.")]]
        if names
    }
    assert not found


def test_the_store_protocol_imports_no_store() -> None:
    """The protocol and the record types stand below both stores: no cycle between a store and
    the protocol it satisfies (store.py and postgres.py imported each other before the split)."""
    for name in ("protocol.py", "records.py"):
        below = imported(ROOT / "store" / name)
        stores = [m for m in below if m.startswith(("cmdc.store.file", "cmdc.store.postgres"))]
        assert not stores
