"""One row per figure, and the table `python -m benchmarks` prints."""

from __future__ import annotations

from collections.abc import Sequence

import attrs


@attrs.frozen
class Row:
    """One figure: which benchmark, what it is, its value, its target and whether it is met
    (`ok` is None when the figure has no target)."""

    benchmark: str
    figure: str
    value: str
    target: str = ""
    ok: bool | None = None

    @property
    def verdict(self) -> str:
        return "" if self.ok is None else ("pass" if self.ok else "MISS")


def check(benchmark: str, figure: str, value: float, fmt: str, target: str, ok: bool | None) -> Row:
    """A row for a number: `fmt` formats it (`"{:.2f}"`), `ok` is the target's verdict."""
    return Row(benchmark, figure, fmt.format(value), target, ok)


def render(rows: Sequence[Row]) -> str:
    """The rows as an aligned text table, then a line per missed target (or none missed)."""
    head = ("benchmark", "figure", "value", "target", "result")
    body = [(r.benchmark, r.figure, r.value, r.target, r.verdict) for r in rows]
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    right = {2}  # values align right

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in pairs).rstrip()

    out = [line(head), "  ".join("-" * w for w in widths)]
    previous = None
    for cells in body:
        if previous is not None and cells[0] != previous:
            out.append("")
        previous = cells[0]
        out.append(line(cells))
    misses = [r for r in rows if r.ok is False]
    with_target = sum(1 for r in rows if r.ok is not None)
    out.append("")
    if misses:
        out.append(f"MISSED {len(misses)} of {with_target} targets:")
        out.extend(f"  ✗ {r.benchmark}: {r.figure} = {r.value} (target {r.target})" for r in misses)
    else:
        out.append(f"all {with_target} targets met")
    return "\n".join(out)
