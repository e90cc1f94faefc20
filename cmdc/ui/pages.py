"""The web page's HTML, rendered on the server: plain strings, every text from a model, a tool,
a user or a store escaped (`esc`), charts as inline SVG. No web framework here."""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode

from ..events import COMPACTION_START, REQUEST, SUMMARIZER_ATTEMPT, TOOL_START, TURN_START
from ..message import Message
from ..store.file.journal import JournalRecord
from .data import AgentDetail, AgentRow, Span, badges, summary_range

SHOWN_CHARS = 4_000  # characters of one message or record shown in a page (the rest: a link)
BAR_WIDTH = 160


def esc(value: object) -> str:
    """`value` as HTML text: `<`, `>`, `&` and both quotes escaped (safe in text and attributes)."""
    return html.escape(str(value), quote=True)


def agent_url(name: str, tail: str = "") -> str:
    return f"/agent/{quote(name, safe='')}{tail}"


def journal_url(name: str, first: int, last: int) -> str:
    return agent_url(name, "/journal?" + urlencode({"first": first, "last": last}))


def raw_url(name: str, seq: int, offset: int = 0) -> str:
    return agent_url(name, "/raw?" + urlencode({"seq": seq, "offset": offset}))


def clock(t: float | None) -> str:
    if t is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def figure(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


def layout(title: str, body: str, *, source: str, live: bool, agent: str | None = None) -> str:
    data = f' data-live="{"1" if live else "0"}"'
    if agent is not None:
        data += f' data-agent="{esc(agent)}"'
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · cmdc</title>"
        '<link rel="stylesheet" href="/static/app.css">'
        '<script src="/static/app.js" defer></script></head>'
        f"<body{data}>"
        '<header><a class="home" href="/">cmdc</a> '
        f'<span class="source">{esc(source)}</span>'
        f'<span id="live" class="live">{"live" if live else "read-only store"}</span></header>'
        f"<main>{body}</main></body></html>"
    )


def bar(row: AgentRow) -> str:
    """Tokens in context against the trigger and the window, as a small SVG bar."""
    tokens = row.tokens or 0
    scale = row.window or max(tokens, row.trigger or 0, 1) * 1.15
    width = min(BAR_WIDTH, int(BAR_WIDTH * tokens / scale)) if scale else 0
    over = row.trigger is not None and tokens >= row.trigger
    mark = ""
    if row.trigger is not None and scale:
        x = min(BAR_WIDTH, int(BAR_WIDTH * row.trigger / scale))
        mark = f'<line class="trigger" x1="{x}" x2="{x}" y1="0" y2="14"/>'
    title = f"{figure(row.tokens)} tokens; trigger {figure(row.trigger)}; window {figure(row.window)}"
    return (
        f'<svg class="bar" width="{BAR_WIDTH}" height="14" viewBox="0 0 {BAR_WIDTH} 14" role="img">'
        f"<title>{esc(title)}</title>"
        f'<rect class="window" x="0" y="2" width="{BAR_WIDTH}" height="10"/>'
        f'<rect class="fill{" over" if over else ""}" x="0" y="2" width="{width}" height="10"/>{mark}</svg>'
    )


def row_cells(row: AgentRow) -> str:
    return (
        f'<td class="name"><a href="{esc(agent_url(row.name))}">{esc(row.name)}</a></td>'
        f'<td class="state"><span class="st st-{esc(row.state.replace(" ", "-"))}">{esc(row.state)}</span></td>'
        f'<td class="barcell">{bar(row)}</td>'
        f'<td class="num tokens">{figure(row.tokens)}</td>'
        f'<td class="num trig">{figure(row.trigger)}</td>'
        f'<td class="num win">{figure(row.window)}</td>'
        f'<td class="num comp">{row.compactions:,}</td>'
        f'<td class="num auto">{row.auto:,}</td>'
        f'<td class="num forced">{row.forced:,}</td>'
        f'<td class="num failed{" bad" if row.failed else ""}">{row.failed:,}</td>'
        f'<td class="last">{esc(clock(row.last))}</td>'
    )


def agents_page(rows: Sequence[AgentRow], *, source: str, live: bool, shown: int) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.state] = counts.get(r.state, 0) + 1
    summary = ", ".join(f"{n:,} {esc(s)}" for s, n in sorted(counts.items()))
    more = f" (the first {shown:,} shown)" if len(rows) > shown else ""
    body = [
        f'<h1>Agents <small id="count">{len(rows):,}{more}</small></h1>',
        f'<p class="muted" id="states">{summary or "no agents yet"}</p>',
        '<table id="agents" class="grid"><thead><tr><th>agent</th><th>state</th><th>context</th>'
        "<th>tokens</th><th>trigger</th><th>window</th><th>compactions</th><th>auto</th><th>forced</th>"
        "<th>failed</th><th>last activity</th></tr></thead><tbody>",
    ]
    body.extend(f'<tr id="a-{esc(r.name)}" data-name="{esc(r.name)}">{row_cells(r)}</tr>' for r in rows[:shown])
    body.append("</tbody></table>")
    return layout("agents", "".join(body), source=source, live=live)


def _y(tokens: float, top: float, height: int) -> float:
    return round(height - 20 - (height - 40) * min(tokens, top) / top, 1)


def timeline(name: str, points: Sequence[dict[str, Any]], row: AgentRow) -> str:
    """Turns (tokens in context at each turn's start) and compactions (a drop from the tokens
    before to after, linked to the journal records evicted) as an SVG chart."""
    if not points:
        return '<p class="muted">No turns or compactions recorded yet.</p>'
    width, height = 900, 260
    figures = [row.window or 0, row.trigger or 0, row.tokens or 0]
    for p in points:
        figures += [p.get("tokens") or 0, p.get("before") or 0, p.get("after") or 0, p.get("evicted_tokens") or 0]
    top = max(figures) * 1.05 or 1.0
    step = (width - 60) / max(1, len(points) - 1)
    parts = [
        f'<svg id="timeline" class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'role="img" aria-label="timeline of turns and compactions">'
    ]
    for label, value, cls in (("window", row.window, "window-line"), ("trigger", row.trigger, "trigger-line")):
        if value:
            y = _y(value, top, height)
            parts.append(f'<line class="{cls}" x1="40" x2="{width - 10}" y1="{y}" y2="{y}"/>')
            parts.append(f'<text class="axis" x="{width - 12}" y="{y - 3}" text-anchor="end">{label} {value:,}</text>')
    parts.append(f'<text class="axis" x="4" y="14">{int(top):,}</text>')
    parts.append(f'<text class="axis" x="4" y="{height - 6}">0</text>')
    line: list[str] = []
    marks: list[str] = []
    for i, p in enumerate(points):
        x = round(40 + i * step, 1)
        kind = p["kind"]
        if kind == "turn" and p.get("tokens") is not None:
            line.append(f"{x},{_y(p['tokens'], top, height)}")
            marks.append(
                f'<circle class="turn" cx="{x}" cy="{_y(p["tokens"], top, height)}" r="2.5">'
                f"<title>turn at {esc(clock(p['time']))}: {p['tokens']:,} tokens</title></circle>"
            )
        elif kind == "compaction":
            first, last = p.get("first_seq"), p.get("last_seq")
            tip = _compaction_tip(p)
            if p.get("before") is not None:
                y1, y2 = _y(p["before"], top, height), _y(p["after"], top, height)
                line.append(f"{x},{y1} {x},{y2}")
            else:
                y1, y2 = _y(p.get("evicted_tokens") or 0, top, height), _y(0, top, height)
            shape = (
                f'<g class="compaction c-{esc(p.get("reason"))}"><line x1="{x}" x2="{x}" y1="{y1}" y2="{y2}"/>'
                f'<circle cx="{x}" cy="{y2}" r="4"/><title>{esc(tip)}</title></g>'
            )
            if isinstance(first, int) and isinstance(last, int) and first > 0:
                shape = f'<a class="to-journal" href="{esc(journal_url(name, first, last))}">{shape}</a>'
            marks.append(shape)
        elif kind == "failed":
            y = _y(p.get("tokens") or 0, top, height)
            marks.append(
                f'<g class="compaction c-failed"><path d="M{x - 5},{y - 5} L{x + 5},{y + 5} M{x - 5},{y + 5} '
                f'L{x + 5},{y - 5}"/><title>{esc("compaction failed: " + str(p.get("error")))}</title></g>'
            )
    if line:
        parts.append(f'<polyline class="tokens" points="{" ".join(line)}"/>')
    parts.extend(marks)
    parts.append("</svg>")
    legend = (
        '<p class="legend"><span class="k k-turn">turn</span> <span class="k k-auto">automatic</span> '
        '<span class="k k-forced">forced</span> <span class="k k-manual">manual</span> '
        '<span class="k k-failed">failed</span> <span class="k k-journal">from the journal</span> '
        "— a compaction's mark opens the journal records it evicted.</p>"
    )
    return "".join(parts) + legend


def _compaction_tip(p: dict[str, Any]) -> str:
    bits = [f"compaction #{p.get('compaction')} ({p.get('reason')}) at {clock(p.get('time'))}"]
    if p.get("before") is not None:
        bits.append(f"{p['before']:,} -> {p['after']:,} tokens")
    bits.append(f"{p.get('evicted')} messages evicted, records {p.get('first_seq')}-{p.get('last_seq')}")
    if p.get("attempts") is not None:
        bits.append(f"summarizer {p.get('summarizer')}: {p.get('attempts')} attempts")
    if p.get("fallback"):
        bits.append(f"fallback: {p['fallback']}")
    return "; ".join(bits)


def compaction_table(name: str, points: Sequence[dict[str, Any]]) -> str:
    rows = [p for p in points if p["kind"] in ("compaction", "failed")]
    if not rows:
        return ""
    out = [
        '<table class="grid" id="compactions"><thead><tr><th>#</th><th>when</th><th>reason</th><th>tokens before</th>'
        "<th>after</th><th>evicted</th><th>records</th><th>summarizer</th><th>attempts (failed)</th>"
        "<th>fallback</th></tr></thead><tbody>"
    ]
    for p in reversed(rows[-200:]):
        if p["kind"] == "failed":
            out.append(
                f'<tr class="bad"><td></td><td>{esc(clock(p.get("time")))}</td><td>failed ({esc(p.get("reason"))})</td>'
                f'<td colspan="7">{esc(p.get("error"))}</td></tr>'
            )
            continue
        first, last = p.get("first_seq"), p.get("last_seq")
        records = (
            f'<a class="range" href="{esc(journal_url(name, first, last))}">{first}-{last}</a>'
            if isinstance(first, int) and isinstance(last, int) and first > 0
            else "—"
        )
        before = (
            figure(p.get("before")) if p.get("before") is not None else f"~{figure(p.get('evicted_tokens'))} evicted"
        )
        attempts = "—" if p.get("attempts") is None else f"{p['attempts']} ({p.get('failed_attempts') or 0})"
        out.append(
            f"<tr><td>{esc(p.get('compaction'))}</td><td>{esc(clock(p.get('time')))}</td>"
            f"<td>{esc(p.get('reason'))}</td><td class=num>{before}</td><td class=num>{figure(p.get('after'))}</td>"
            f"<td class=num>{esc(p.get('evicted'))}</td><td>{records}</td><td>{esc(p.get('summarizer') or '—')}</td>"
            f"<td>{esc(attempts)}</td><td>{esc(p.get('fallback') or '—')}</td></tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def clipped_text(text: str, limit: int = SHOWN_CHARS) -> tuple[str, int]:
    if len(text) <= limit:
        return text, 0
    return text[:limit], len(text) - limit


def message_block(name: str, index: int, m: Message) -> str:
    marks = badges(m)
    shown, more = clipped_text(m.text)
    link = ""
    span = summary_range(m) if m.is_summary else None
    if span is not None:
        link = (
            f' <a class="replaced" href="{esc(journal_url(name, *span))}">'
            f"replaced journal records {span[0]}-{span[1]}</a>"
        )
    calls = "".join(
        f'<div class="call">→ {esc(c.name)}({esc(_short(str(dict(c.arguments)), 600))})</div>' for c in m.tool_calls
    )
    tail = f'<div class="more">… {more:,} more characters</div>' if more else ""
    tags = "".join(f'<span class="badge b-{esc(b.split()[0])}">{esc(b)}</span>' for b in marks)
    return (
        f'<div class="msg role-{esc(m.role)}{" is-summary" if m.is_summary else ""}" id="m{index}">'
        f'<div class="head"><span class="idx">{index}</span> <span class="role">{esc(m.role)}</span> {tags}'
        f'<span class="mid">{esc(m.id)}</span>{link}</div>'
        f'<pre class="text">{esc(shown)}</pre>{tail}{calls}</div>'
    )


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _get(data: Any, key: str) -> Any:
    return data.get(key) if data is not None else None


def span_label(span: Span) -> tuple[str, str]:
    """A span's name and its figures, in words (from the events that opened and closed it)."""
    d, e = span.data, span.end_data
    if span.kind == TURN_START:
        bits = [f"{_get(d, 'messages')} messages, {_get(d, 'tokens')} tokens"]
        if e is not None:
            usage = _get(e, "usage")
            bits.append(f"{_get(e, 'steps')} steps")
            if usage is not None:
                bits.append(
                    f"usage {getattr(usage, 'input_tokens', '?')} in / {getattr(usage, 'output_tokens', '?')} out"
                )
            if _get(e, "aborted"):
                bits.append(f"aborted: {_get(e, 'reason')}")
        return "turn", "; ".join(bits)
    if span.kind == REQUEST:
        detail = f"{_get(d, 'messages')} messages, {_get(d, 'tokens')} tokens"
        if e is not None:
            usage = _get(e, "usage")
            detail += f"; {getattr(usage, 'output_tokens', '?')} tokens out"
            if _get(e, "tool_calls"):
                detail += f", {_get(e, 'tool_calls')} tool calls"
        return "model request", detail
    if span.kind == TOOL_START:
        error = _get(e, "error")
        return f"tool {_get(d, 'tool')}", f"error: {error}" if error else ""
    if span.kind == COMPACTION_START:
        detail = f"{_get(d, 'tokens')} tokens"
        report = _get(e, "report")
        if report is not None:
            detail += (
                f"; {report.tokens_before} -> {report.tokens_after} tokens, {report.evicted} evicted "
                f"(records {report.first_seq}-{report.last_seq})"
            )
        elif _get(e, "error") is not None:
            detail += f"; failed: {_get(e, 'error')}"
        return f"compaction ({_get(d, 'reason')})", detail
    if span.kind == SUMMARIZER_ATTEMPT:
        if _get(d, "ok"):
            outcome = f"{_get(d, 'chunk_tokens')} -> {_get(d, 'output_tokens')} tokens"
        else:
            outcome = f"failed: {_get(d, 'error')}"
        return f"summarizer {_get(d, 'summarizer')}", f"{_get(d, 'role')} attempt {_get(d, 'attempt')}: {outcome}"
    what = _get(d, "fallback") or _get(d, "summarizer")
    return f"fallback {what}", str(_get(d, "error") or "")


def span_tree(span: Span) -> str:
    took = "…" if span.end is None else f"{(span.end - span.start) * 1000:,.0f} ms"
    name, detail = span_label(span)
    kids = "".join(span_tree(c) for c in span.children or ())
    if span.dropped:
        kids += f'<li class="muted">… {span.dropped:,} more</li>'
    inner = f"<ul>{kids}</ul>" if kids else ""
    return (
        f'<li class="span{" bad" if span.error else ""}"><b>{esc(name)}</b> '
        f'<span class="took">{esc(took)}</span> <span class="muted">{esc(detail)}</span>{inner}</li>'
    )


def agent_page(d: AgentDetail, *, source: str, writable: bool) -> str:
    name = d.row.name
    r = d.row
    body = [
        f'<h1>{esc(name)} <span class="st st-{esc(r.state.replace(" ", "-"))}">{esc(r.state)}</span></h1>',
        '<div id="summary" class="cards">',
        f"<div><b>{figure(r.tokens)}</b> tokens in context {bar(r)}</div>",
        f"<div><b>{figure(r.trigger)}</b> trigger · <b>{figure(r.window)}</b> window</div>",
        f"<div><b>{r.compactions:,}</b> compactions: {r.auto:,} automatic, {r.forced:,} forced, "
        f"{r.manual:,} manual, <span{' class=bad' if r.failed else ''}>{r.failed:,} failed</span></div>",
        f"<div>last activity {esc(clock(r.last))}</div></div>",
        f'<p><a id="journal-link" href="{esc(agent_url(name, "/journal"))}">journal: search and read records</a></p>',
    ]
    if writable and d.live:
        body.append(
            f'<form method="post" action="{esc(agent_url(name, "/compact"))}"><button>compact now</button></form>'
        )
    body += ["<h2>Timeline</h2>", timeline(name, d.points, r), compaction_table(name, d.points)]
    if d.live:
        body.append("<h2>Last turns</h2>")
        if d.turns:
            trees = "".join(f'<ul class="tree">{span_tree(s)}</ul>' for s in reversed(d.turns))
            body.append(f'<div id="turns">{trees}</div>')
        elif d.traced:
            body.append('<p class="muted">No turn recorded yet: the next ones appear here.</p>')
        else:
            body.append(
                '<p class="muted">Span trees of turns are recorded while tracing is on '
                "(open_runtime(tracing=...)) or while this agent's page is open.</p>"
            )
    body.append("<h2>Context</h2>")
    if d.messages is None:
        body.append('<p class="muted">No state known (a journal without a checkpoint).</p>')
    else:
        body.append(f'<p class="muted">{len(d.messages):,} messages, oldest first.</p><div id="context">')
        shown = d.messages[-500:]
        if len(d.messages) > len(shown):
            body.append(f'<p class="muted">… {len(d.messages) - len(shown):,} earlier messages not shown</p>')
        start = len(d.messages) - len(shown)
        body.extend(message_block(name, start + i, m) for i, m in enumerate(shown))
        body.append("</div>")
    return layout(name, "".join(body), source=source, live=d.live, agent=name)


def record_block(name: str, r: JournalRecord, shown_chars: int = SHOWN_CHARS) -> str:
    m = r.message
    text, more = clipped_text(m.text, shown_chars)
    more += r.clipped
    tail = ""
    if more:
        tail = (
            f'<div class="more">… clipped: {more:,} more characters. '
            f'<a class="raw" href="{esc(raw_url(name, r.seq, len(text)))}">read the rest (raw)</a></div>'
        )
    calls = "".join(
        f'<div class="call">→ {esc(c.name)}({esc(_short(str(dict(c.arguments)), 600))})</div>' for c in m.tool_calls
    )
    tags = "".join(f'<span class="badge b-{esc(b.split()[0])}">{esc(b)}</span>' for b in badges(m))
    return (
        f'<div class="msg record role-{esc(m.role)}" id="r{r.seq}"><div class="head"><span class="idx">#{r.seq}</span> '
        f'<span class="role">{esc(m.role)}</span> {tags}<span class="muted">compaction {r.compaction} · '
        f'{esc(clock(r.timestamp))}</span></div><pre class="text">{esc(text)}</pre>{tail}{calls}</div>'
    )


def journal_page(
    name: str,
    records: Sequence[JournalRecord],
    *,
    source: str,
    live: bool,
    query: str = "",
    first: int | None = None,
    last: int | None = None,
    total: int | None = None,
    note: str = "",
) -> str:
    form = (
        f'<form id="search" method="get" action="{esc(agent_url(name, "/journal"))}">'
        f'<input name="q" value="{esc(query)}" placeholder="search words" size="40"> <button>search</button></form>'
        f'<form id="range" method="get" action="{esc(agent_url(name, "/journal"))}">records '
        f'<input name="first" type="number" min="1" value="{esc(first or "")}"> to '
        f'<input name="last" type="number" min="1" value="{esc(last or "")}"> <button>read</button></form>'
    )
    if query:
        head = f"{len(records):,} records match {esc(query)!s}, best first"
    else:
        head = f"records {first}-{last}" + (f" of {total:,}" if total is not None else "")
    nav = ""
    if not query and first is not None and last is not None:
        size = last - first + 1
        links = []
        if first > 1:
            links.append(f'<a href="{esc(journal_url(name, max(1, first - size), first - 1))}">← earlier</a>')
        if total is None or last < total:
            links.append(f'<a href="{esc(journal_url(name, last + 1, last + size))}">later →</a>')
        nav = f'<p class="nav">{" · ".join(links)}</p>'
    body = [
        f'<h1>Journal of <a href="{esc(agent_url(name))}">{esc(name)}</a></h1>',
        form,
        f'<p id="journal-head">{head}</p>',
        f'<p class="muted">{esc(note)}</p>' if note else "",
        nav,
        '<div id="records">',
        *(record_block(name, r) for r in records),
        "</div>",
        nav,
    ]
    return layout(f"journal of {name}", "".join(body), source=source, live=live)


def message_page(title: str, text: str, *, source: str = "", status: str = "") -> str:
    return layout(title, f"<h1>{esc(title)}</h1><p>{esc(text)}</p>", source=source or status, live=False)
