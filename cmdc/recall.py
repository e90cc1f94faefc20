"""Recall: a built-in tool that reads evicted history back from the agent's own offload journal.

Every compaction replaces old messages with a summary that names the journal and the range of
records (`seq`) holding what it replaced. `recall_tool` gives the model a way back to them: a
search by words, or a read by record range, as plain text bounded by a token budget. Switch it
on for an agent with `Runtime.spawn(..., recall=True)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import partial

import attrs
import orjson
import trio

from ._check import integer
from ._clip import clip
from .errors import ConfigError, ToolArgumentsError
from .message import Message
from .store import JournalReader
from .store import search as _words
from .store.records import JournalRecord
from .store.search import MAX_QUERY_CHARS
from .tokens import estimate_text_tokens
from .tools import Tool, tool

DEFAULT_RANGE = 20
"""How many records after `first` a read covers when `last` is not given."""

MAX_LIMIT = 50
"""The most records a search may ask for."""

MIN_BUDGET = 200
"""The smallest output budget a recall tool accepts (room for a record and the notes)."""

_CUT_MIN_TOKENS = 100  # with less room than this, a record that does not fit is left out, not cut
_LISTED = 10  # how many seqs of records not shown the closing note names
_ALONE_OVERHEAD = 200  # bytes of notes around a record read alone (intro line)
_WORD = re.compile(r"\w")  # what the journal search counts as a word character
MAX_SEQ = 2**63 - 1  # a record number past a 64-bit integer names no record (and no store column holds it)

DESCRIPTION = (
    "Read back earlier parts of this conversation that were moved out of your context. When the "
    "context grows too long, old messages are replaced by a conversation summary; the summary names "
    "the journal that keeps them and the records it replaces (for example 'records 1-14'). Nothing "
    "is lost: use recall whenever you need an exact detail that the summary left out or only "
    "paraphrased (file contents, numbers, identifiers, error messages, tool outputs, the user's "
    "earlier instructions) instead of guessing. Either search by words (query), or read a range of "
    "records (first, and optionally last), not both. Each record shows its number, the compaction "
    "that moved it out, and its role. The output is bounded in size: when it says records were "
    "left out or cut, read those by range. A large tool result capped or masked in your context "
    "names its record: read parts of it with record and line_start/line_end (lines, from 1) or "
    "byte_start/byte_end (bytes, from 0, end excluded)."
)

Footer = Callable[[list[int]], str | None]


def _header(record: JournalRecord) -> str:
    m = record.message
    role: str = m.role
    if m.is_summary:
        role += " (an earlier conversation summary)"
    if m.tool_call_id is not None:
        role += f" (call {m.tool_call_id}{', error' if m.is_error else ''})"
    if m.tool_calls:
        role += " -> " + ", ".join(c.name for c in m.tool_calls)
    return f"[record {record.seq} · compaction {record.compaction} · {role}]"


def _body(message: Message) -> str:
    lines = [message.text] if message.text else []
    for call in message.tool_calls:
        args = orjson.dumps(call.to_dict()["arguments"]).decode()
        lines.append(f"-> call {call.name} (id {call.id}) {args}")
    outcomes = message.metadata.get(_OUTCOMES_KEY)
    if isinstance(outcomes, (tuple, list)):
        lines.extend(str(line) for line in outcomes)
    return "\n".join(lines) if lines else "(no text)"


_OUTCOMES_KEY = "cmdc.recall.outcomes"
"""Where a search hit that is a tool call carries its results' outcome lines, for showing (set
by `with_results` on the copy it shows; never journaled)."""


def _size(text: str, cap: int | None = None) -> int:
    """The UTF-8 size of `text`; past `cap` characters, its length in characters (a lower
    bound, already over `cap`), without encoding it all."""
    if cap is not None and len(text) > cap:
        return len(text)
    return len(text.encode("utf-8"))


def _head(text: str, max_bytes: int) -> str:
    """The longest prefix of `text` whose UTF-8 encoding fits in `max_bytes` (only that many
    characters of `text` are looked at: a character is at least one byte)."""
    return clip(text[: max(0, max_bytes)], max_bytes, keep="head", marker="")


def _seq_list(seqs: Sequence[int]) -> str:
    named = ", ".join(str(s) for s in seqs[:_LISTED])
    return named + (f" and {len(seqs) - _LISTED} more" if len(seqs) > _LISTED else "")


def _quote(query: str) -> str:
    query = " ".join(query.split())
    return orjson.dumps(clip(query, 80, keep="head", marker="…")).decode()


def _shown(number: int) -> str:
    """A number for an error message: a huge one by its size (its digits could be thousands)."""
    return str(number) if abs(number) <= MAX_SEQ else f"a {number.bit_length()}-bit number"


def _not_text(query: str) -> str | None:
    """Why `query` cannot be searched for as text (a lone surrogate: not Unicode text, as a
    message refuses it; a NUL character: no store keeps one in text), or None."""
    if "\0" in query:
        return f"it holds a NUL character at position {query.index(chr(0))}"
    if not query.isascii():
        try:
            query.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"it holds a lone surrogate (U+{ord(query[exc.start]):04X}) at position {exc.start}"
    return None


def _span(records: Sequence[JournalRecord]) -> str:
    return f"{records[0].seq}-{records[-1].seq}"


def _originals_first(hits: list[JournalRecord]) -> list[JournalRecord]:
    """The search's order, except that earlier summaries come after every original message:
    a summary repeats many words but only paraphrases records that are themselves in the
    journal, and the original holds the exact details. Of records that say the same thing (one
    command run ten times, one question asked again), the newest takes the place of the best
    ranked and the others come after every other original: copies of one call would fill the
    top five, and the newest is the one asked about."""
    originals = [r for r in hits if not r.message.is_summary]
    newest: dict[tuple[object, ...], JournalRecord] = {}
    for r in originals:
        key = _same(r.message)
        if key not in newest or r.seq > newest[key].seq:
            newest[key] = r
    first = [newest[k] for k in dict.fromkeys(_same(r.message) for r in originals)]
    chosen = {r.seq for r in first}
    repeats = [r for r in originals if r.seq not in chosen]
    return first + repeats + [r for r in hits if r.message.is_summary]


def _same(message: Message) -> tuple[object, ...]:
    """What makes two records say the same thing: role, text, the calls' names and arguments
    (a tool result never repeats another: it answers its own call)."""
    if message.role == "tool":
        return (message.role, message.tool_call_id, message.text)
    calls = tuple(
        (c.name, orjson.dumps(c.to_dict()["arguments"], option=orjson.OPT_SORT_KEYS)) for c in message.tool_calls
    )
    return (message.role, message.text, calls)


_FRAME = " \t=-_*#~"
"""What a tool output's last line is framed with ("===== 3 passed in 1.2s =====")."""
RESULT_LINE_CHARS = 200
"""Characters of a call's result shown with the call (its outcome line)."""


def outcome_line(result: Message) -> str:
    """A tool result in one line: its first line when it is an error, else its last line that
    says something (a test run's tally, "Created x.py"), without the framing."""
    if result.is_error:
        lines = [ln.strip(_FRAME) for ln in result.text[:4096].splitlines()]
    else:
        lines = [ln.strip(_FRAME) for ln in reversed(result.text[-4096:].splitlines())]
    said = next((ln for ln in lines if ln), "(no text)")
    return clip(said, RESULT_LINE_CHARS, keep="head", marker="…")


async def with_results(store: JournalReader, agent_id: str, hits: list[JournalRecord]) -> list[JournalRecord]:
    """`hits` with each tool call's outcome shown under it (`<- name result, record N: line`):
    a call found by its command or path says what came of it (the result follows it in the
    journal). One read per call hit, of the records right after it."""
    out: list[JournalRecord] = []
    for hit in hits:
        calls = {c.id: c.name for c in hit.message.tool_calls}
        if not calls or hit.message.role != "assistant":
            out.append(hit)
            continue
        after = await store.read_range(agent_id, hit.seq + 1, hit.seq + len(calls), max_chars=8192)
        lines = [
            f"<- {calls[r.message.tool_call_id]} result{' (error)' if r.message.is_error else ''}, "
            f"record {r.seq}: {outcome_line(r.message)}"
            for r in after
            if r.message.role == "tool" and r.message.tool_call_id in calls
        ]
        if lines:
            shown = hit.message.evolve(metadata={**hit.message.metadata, _OUTCOMES_KEY: tuple(lines)})
            hit = attrs.evolve(hit, message=shown)
        out.append(hit)
    return out


EXCERPT_SCAN_CHARS = 64 * 1024
"""Characters of a large search hit's text scanned for the lines holding the query's words."""
EXCERPT_LINE_CHARS = 240
"""Characters of one line an excerpt shows at most."""


def excerpt(record: JournalRecord, query: str, room: int) -> tuple[str, int] | None:
    """A search hit too large for its share of the output (`room` bytes) as the lines that
    hold the query's words (the lines holding most of its distinct words first, shown in
    their order, each cut to `EXCERPT_LINE_CHARS`), with a note naming the record to read it
    whole: (text, characters left out). None when the record fits or no line holds a word."""
    body = _body(record.message)
    if _size(body, cap=room) + record.clipped <= room:
        return None
    terms = set(_words.query_terms(query)[0])
    lines = body[: _words.TEXT_CHARS].splitlines()
    scored = []
    for i, line in enumerate(lines):
        found = terms.intersection(_words.tokens(line[:4096]))
        if found:
            scored.append((-len(found), i))
    if not scored:
        return None
    note = f"[… lines of record {record.seq} holding the words searched; read it with first={record.seq}]"
    chosen: list[int] = []
    used = _size(note) + 1
    for _, i in sorted(scored):
        line = clip(lines[i], EXCERPT_LINE_CHARS, keep="head", marker="…")
        if used + _size(line) + 1 > room:
            break
        chosen.append(i)
        used += _size(line) + 1
    if not chosen:
        return None
    shown = [clip(lines[i], EXCERPT_LINE_CHARS, keep="head", marker="…") for i in sorted(chosen)]
    return "\n".join([*shown, note]), len(body) + record.clipped - sum(map(len, shown))


def render_records(
    intro: str,
    records: Sequence[JournalRecord],
    *,
    budget_tokens: int,
    journal: str,
    footer: Footer,
    query: str | None = None,
) -> str:
    """`intro`, then one block per record in order while they fit in `budget_tokens`; a record
    that does not fit is cut to a head with a marker (given room enough, else left out), and
    `footer(seqs of the records not shown)`, unless None, closes the output. With `query` (a
    search's hits), a record larger than an even share of the budget shows the lines holding
    the query's words instead (`excerpt`), so the best hits all fit."""
    budget = budget_tokens * 4  # estimate_text_tokens is UTF-8 bytes / 4, rounded up
    seqs = [r.seq for r in records]
    # Room kept for the closing note, in its longest form (every record left out).
    reserve = 2 + _size(footer(seqs) or "") + 8 * _LISTED
    share = (budget - _size(intro) - reserve) // max(1, len(records)) - 80
    parts = [intro]
    used = _size(intro)
    shown = 0
    for record in records:
        header, body = _header(record), _body(record.message)
        more = record.clipped  # characters of the text the store left out
        cut = excerpt(record, query, share) if query is not None and share > 0 else None
        if cut is not None:
            body, more = cut[0], 0
        cost = 2 + _size(header) + 1 + _size(body, cap=budget) + more
        if used + cost + reserve <= budget:
            parts.append(f"{header}\n{body}")
            used += cost
            shown += 1
            continue
        room = budget - used - reserve - 2
        if room >= _CUT_MIN_TOKENS * 4:
            if cost - 2 + _ALONE_OVERHEAD <= budget:
                marker = "[... {k} more characters; read record " + f"{record.seq} alone to see it all]"
            else:
                marker = (
                    "[... {k} more characters; the record is larger than the recall budget: the whole "
                    f"text is in the journal {journal}, record {record.seq}]"
                )
            fixed = _size(header) + 2 + _size(marker.format(k=len(body) + more))
            head = _head(body, room - fixed)
            parts.append(f"{header}\n{head}\n{marker.format(k=len(body) + more - len(head))}")
            shown += 1
        break
    note = footer(seqs[shown:])
    if note is not None:
        parts.append(note)
    text = "\n\n".join(parts)
    if estimate_text_tokens(text) > budget_tokens:  # not expected: the reserve covers the notes
        text = _head(text, budget)
    return text


def record_part(
    record: JournalRecord,
    budget_bytes: int,
    lines: tuple[int | None, int | None] | None,
    span: tuple[int | None, int | None] | None,
) -> str:
    """One record's text, or the lines or bytes asked for, within `budget_bytes` (cut at the
    last whole line that fits, with a note saying where to go on). Pure; may take a while on a
    huge record (run it in a worker thread)."""
    text = _body(record.message)
    header = _header(record)
    if span is not None:
        data = text.encode("utf-8")
        first = span[0] or 0
        end = min(len(data), span[1] if span[1] is not None else len(data))
        if first >= len(data):
            return f"{header}\nThe record holds {len(data)} bytes: byte_start={first} is past its end."
        room = max(1, budget_bytes - len(header) - 200)
        stop = min(end, first + room)
        piece = data[first:stop].decode("utf-8", "ignore")  # a character cut at an edge is left out
        where = f"bytes {first}-{stop} of {len(data)} (end excluded)"
        more = f"\n[… continue with record={record.seq}, byte_start={stop}]" if stop < end else ""
        return f"{header} {where}\n{piece}{more}"
    rows = text.splitlines(keepends=True)
    first = (lines[0] if lines is not None else None) or 1
    last = min(len(rows), (lines[1] if lines is not None else None) or len(rows))
    if first > len(rows):
        return f"{header}\nThe record holds {len(rows)} lines: line_start={first} is past its end."
    room = max(1, budget_bytes - len(header) - 200)
    out: list[str] = []
    used, n = 0, first
    while n <= last:
        size = len(rows[n - 1].encode("utf-8"))
        if used + size > room:
            if not out:  # one line larger than the budget: its head
                out.append(_head(rows[n - 1], room) + "\n[… the line goes on; read it with byte ranges]\n")
                n += 1
            break
        out.append(rows[n - 1])
        used += size
        n += 1
    where = f"lines {first}-{n - 1} of {len(rows)}"
    more = f"\n[… continue with record={record.seq}, line_start={n}]" if n <= last else ""
    return f"{header} {where}\n{''.join(out)}{more}"


def recall_tool(store: JournalReader, agent_id: str, *, budget_tokens: int = 2_000, name: str = "recall") -> Tool:
    """A tool that reads `agent_id`'s offload journal in `store` (any store of `cmdc.store`, or
    an `OffloadStore`): search by words, or read a range of records; its output is plain text
    within `budget_tokens` (estimated) tokens.

    Bad arguments raise `ToolArgumentsError` (an agent turns that into an error result the model
    can read); an empty or missing journal answers that nothing has been offloaded yet."""
    integer(budget_tokens, "recall budget_tokens", minimum=MIN_BUDGET)
    if not isinstance(store, JournalReader):
        raise ConfigError(f"recall needs an OffloadStore or a store, got {store!r:.80}")
    journal = store.location(agent_id)  # ConfigError for an unsafe agent id, before any call
    # The hits asked of the store: enough for the largest limit and the count shown, few enough
    # that a common word in a journal of a million records decodes a few dozen records, not
    # thousands (past it, the count says "or more").
    most = 2 * MAX_LIMIT
    # A store that can cut texts hands over no more of a record than a budget can show (plus
    # one character, so a cut record still counts as too large): a huge record's text is never
    # built whole. The output is the same as from whole records.
    cut = budget_tokens * 4 + 1

    def nothing_yet() -> str:
        return (
            f"Nothing has been offloaded yet: the journal {journal} is empty or missing, "
            "so everything said so far is still in your context."
        )

    async def search(query: str, limit: int) -> str:
        hits = _originals_first(await store.search(agent_id, query, limit=most, max_chars=cut))
        if not hits:
            count, span = await extent()
            if not count:
                return nothing_yet()
            return (
                f"No records match {_quote(query)} in the journal ({count} records, "
                f"{span}). Try other words: a synonym, a file name, an identifier or a number, "
                "or fewer words; or read a range of records named in the conversation summary (first, last)."
            )
        candidates, beyond = hits[:limit], [r.seq for r in hits[limit:]]
        if cut:  # a hit cut to the budget is read again further, for the lines holding the words
            wider = {"max_chars": EXCERPT_SCAN_CHARS}
            for i, r in enumerate(candidates):
                if r.clipped:
                    again = await store.read_range(agent_id, r.seq, r.seq, **wider)
                    candidates[i] = again[0] if again else r
        candidates = await with_results(store, agent_id, candidates)
        more = "+" if len(hits) >= most else ""
        intro = f"{len(hits)}{more} records match {_quote(query)}, best match first"
        intro += f" (showing at most limit={limit}):" if beyond else ":"

        def footer(not_shown: list[int]) -> str | None:
            left = [*not_shown, *beyond]
            if not left:
                return None
            why = "the output budget is used up" if not_shown else f"limit={limit}"
            if not_shown and beyond:
                why = f"limit={limit} and the output budget"
            return (
                f"[{len(left)}{more} more matching records not shown ({why}): records {_seq_list(left)}. "
                f"Read one with first={left[0]}, last={left[0]}; or search with more specific words.]"
            )

        return await render(intro, candidates, footer, query)

    async def render(intro: str, records: Sequence[JournalRecord], footer: Footer, query: str | None = None) -> str:
        # Bounded by the budget: a record larger than it is neither encoded nor copied whole.
        work = partial(
            render_records, intro, records, budget_tokens=budget_tokens, journal=journal, footer=footer, query=query
        )
        return await trio.to_thread.run_sync(work) if query is not None else work()

    async def extent() -> tuple[int, str]:
        """How many records the journal holds and their span ("first-last"), from its index."""
        ext = await store.extent(agent_id)
        return ext.records, f"{ext.first_seq}-{ext.last_seq}"

    async def read(first: int, last: int) -> str:
        chosen = await store.read_range(agent_id, first, last, max_chars=cut)  # the index gives the range
        count, span = await extent()
        if not count:
            return nothing_yet()
        if not chosen:
            return f"No records in {first}-{last}: the journal holds records {span}."
        intro = f"Records {first}-{last} of the journal (it holds records {span}):"

        def footer(not_shown: list[int]) -> str | None:
            if not not_shown:
                return None
            return (
                f"[{len(not_shown)} more records in {first}-{last} not shown: the output budget "
                f"({budget_tokens} tokens) is used up. Continue with first={not_shown[0]}, last={last}.]"
            )

        return await render(intro, chosen, footer)

    async def part(
        seq: int, lines: tuple[int | None, int | None] | None, span: tuple[int | None, int | None] | None
    ) -> str:
        found = await store.read_range(agent_id, seq, seq)
        if not found:
            records = await store.records(agent_id, max_chars=cut)
            if not records:
                return nothing_yet()
            return f"No record {seq}: the journal holds records {_span(records)}."
        return await trio.to_thread.run_sync(partial(record_part, found[0], budget_tokens * 4, lines, span))

    async def recall(
        query: str | None = None,
        first: int | None = None,
        last: int | None = None,
        limit: int = 8,
        record: int | None = None,
        line_start: int | None = None,
        line_end: int | None = None,
        byte_start: int | None = None,
        byte_end: int | None = None,
    ) -> str:
        """Read back messages that were moved out of the context.

        Args:
            query: Words to search for (a name, a number, an identifier, a phrase); the best matches come first.
                At most 4000 characters.
            first: The first record to read (records are numbered from 1; the summary names its range).
                Left out with last given: the 20 records before last.
            last: The last record to read, inclusive; defaults to first + 20.
            limit: The most records a search returns, 1 to 50.
            record: One record to read in parts (a capped or masked tool result names it).
            line_start: With record: the first line to show, from 1.
            line_end: With record: the last line to show, inclusive.
            byte_start: With record: the first byte to show, from 0.
            byte_end: With record: where the bytes shown end (excluded).
        """
        errors: list[str] = []
        ranged = first is not None or last is not None
        by_lines = line_start is not None or line_end is not None
        by_bytes = byte_start is not None or byte_end is not None
        if record is not None or by_lines or by_bytes:
            if record is None:
                errors.append("line_start/line_end and byte_start/byte_end read parts of one record: give record")
            elif record < 1:
                errors.append(f"record must be a record number, 1 or more; got {record}")
            if query is not None or ranged:
                errors.append("give record (one record, in parts) without query or first/last")
            if by_lines and by_bytes:
                errors.append("give either line_start/line_end or byte_start/byte_end, not both")
            bounds: tuple[tuple[str, int | None, int], ...] = (("line_start", line_start, 1), ("line_end", line_end, 1))
            bounds += (("byte_start", byte_start, 0), ("byte_end", byte_end, 1))
            for key, value, low in bounds:
                if value is not None and value < low:
                    errors.append(f"{key} must be {low} or more, got {value}")
            if line_start is not None and line_end is not None and line_start > line_end:
                errors.append(f"line_start ({line_start}) must not be greater than line_end ({line_end})")
            if byte_start is not None and byte_end is not None and byte_start >= byte_end:
                errors.append(f"byte_start ({byte_start}) must be less than byte_end ({byte_end})")
            if errors:
                raise ToolArgumentsError(errors, tool=name)
            assert record is not None
            return await part(
                record, (line_start, line_end) if by_lines else None, (byte_start, byte_end) if by_bytes else None
            )
        if query is not None and ranged:
            errors.append("give either query (search by words) or first/last (read a range of records), not both")
        elif query is None and not ranged:
            errors.append("give query (words to search for) or first (and optionally last) to read a range of records")
        elif query is not None and len(query) > MAX_QUERY_CHARS:
            errors.append(
                f"query is {len(query)} characters long, at most {MAX_QUERY_CHARS}: use a few distinctive words"
            )
        elif query is not None and (bad := _not_text(query)) is not None:
            errors.append(f"query is not valid text: {bad}")
        elif query is not None and not _WORD.search(query):
            errors.append(f"query {_quote(query)} has no words to search for")
        for key, value in (("first", first), ("last", last)):
            if value is not None and value < 1:
                errors.append(f"{key} must be a record number, 1 or more; got {_shown(value)}")
            elif value is not None and value > MAX_SEQ:
                errors.append(f"{key} must be a record number, at most {MAX_SEQ}; got {_shown(value)}")
        if first is not None and last is not None and first > last:
            errors.append(f"first ({first}) must not be greater than last ({last})")
        if not 1 <= limit <= MAX_LIMIT:
            errors.append(f"limit must be between 1 and {MAX_LIMIT}, got {_shown(limit)}")
        if errors:
            raise ToolArgumentsError(errors, tool=name)
        if query is not None:
            return await search(query, limit)
        if first is None:
            assert last is not None
            first = max(1, last - DEFAULT_RANGE)
        return await read(first, first + DEFAULT_RANGE if last is None else last)

    return tool(recall, name=name, description=DESCRIPTION)


__all__ = ["DESCRIPTION", "recall_tool", "render_records"]
