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
