"""Imports go downward or sideways without cycles: the providers (among them the extractive
summarizer) and the stores never import the compaction package, which imports them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "cmdc"
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


# docs/design.md's layers. A new module gets its layer here (the test below names any that has none).
LAYERS = {
    0: "message state errors tokens events _groups _report _synthetic _check _clip _frozen _trio _version _redact",
    # store: the package; offload _index postgres checkpoint _fs _search _bigjson: its old paths
    1: "store offload _index postgres checkpoint _fs _search _bigjson"
    " plugins compaction providers tools recall tracing otel mcp",
    2: "agent runtime bus ray cluster",
    3: "cli __init__ __main__ ui testing",
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


def _is_module(root: Path, parts: list[str]) -> bool:
    """Whether `<parts>` (dotted, from `cmdc`) is a module or package under `root`'s parent,
    not a name defined in one."""
    path = root.parent.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_reach(path: Path, root: Path = ROOT) -> list[str]:
    """The underscored names `path` (a module under `root`, the `cmdc` directory) imports from
    another package. A name `_x` defined in a module belongs to that module's package (its
    sibling modules may import it); a module `_m` also serves the packages below its own
    (`cmdc._check` serves all of cmdc). Dunder names are not private."""
    here = list(path.relative_to(root.parent).with_suffix("").parts)
    package = here[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - node.level + 1]
        elif node.module and (node.module == "cmdc" or node.module.startswith("cmdc.")):
            base = []
        else:
            continue  # not cmdc's
        module = [*base, *(node.module.split(".") if node.module else [])]
        for alias in node.names:
            parts = [*module, alias.name]
            for i, part in enumerate(parts):
                if not part.startswith("_") or part.startswith("__"):
                    continue
                if _is_module(root, parts[: i + 1]):  # a private module: its package and those below
                    owner = parts[:i]
                    ok = package[:i] == owner
                else:  # a private name: the package of the module defining it, exactly
                    in_package = (root.parent.joinpath(*parts[:i]) / "__init__.py").is_file()
                    owner = parts[:i] if in_package else parts[: i - 1]
                    ok = package == owner
                if not ok:
                    out.append(f"{'.'.join(parts)} (private to {'.'.join(owner)})")
    return out


KNOWN_REACH: set[str] = set()  # none left: the process-wide store cache went with the storage packages


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_of_another_packages_private_names(path: Path) -> None:
    """docs/design.md: no module imports another package's underscored names; sibling modules of one
    package may share theirs (to share one wider, make it a public name of the package's
    internal module, or a method)."""
    assert not [r for r in private_reach(path) if r not in KNOWN_REACH]


@pytest.mark.parametrize(
    ("module", "source", "flagged"),
    [
        ("cluster/x.py", "from ..runtime.mailbox import _Reply", True),
        ("cluster/x.py", "from cmdc.runtime.ref import _stop", True),
        ("cluster/x.py", "from cmdc.runtime import _private", True),
        ("cluster/x.py", "from ..providers import _http", True),
        ("cluster/x.py", "from ..providers._http import Settings", True),
        ("cluster/x.py", "from .. import _check", False),
        ("runtime/x.py", "from .mailbox import _private", False),  # siblings share
        ("runtime/x.py", "from . import _private", False),
        ("runtime/x.py", "from .._check import choice", False),  # the root's helpers serve all
        ("runtime/x.py", "from ..events import __all__", False),
        ("runtime/x.py", "from os import _exit", False),
        ("x.py", "from .providers._http import Settings", True),
        ("x.py", "from ._check import _private", False),
    ],
)
def test_the_private_reach_check(tmp_path: Path, module: str, source: str, flagged: bool) -> None:
    """The check above, on a small tree of cmdc's shape."""
    root = tmp_path / "cmdc"
    for name in (
        "__init__.py",
        "_check.py",
        "events.py",
        "runtime/__init__.py",
        "runtime/mailbox.py",
        "runtime/ref.py",
        "cluster/__init__.py",
        "providers/__init__.py",
        "providers/_http.py",
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    (root / module).write_text(source + "\n")
    assert bool(private_reach(root / module, root)) is flagged


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
    """docs/design.md: no module imports another package's underscored names. The store package
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
