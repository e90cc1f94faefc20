"""What the web page shows, read from a running runtime or from a store (no web framework here).

`Recorder` follows a runtime's event bus (one all-agents subscription) and keeps, per agent,
bounded figures: compactions by reason, the timeline of turns and compactions, the last turns'
span trees, last activity. Pages read it; the live-update streams are woken by it and coalesce
what changed (`Watcher`), so a slow page never holds an event, and never an agent.

`LiveSource` and `StoreSource` answer the same questions (the agents, one agent, its journal).
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

import attrs
import trio

from .._report import CompactionReport
from ..compaction.config import CompactConfig
from ..errors import CmdcError
from ..events import (
    ACTIVATED,
    COMPACTION_END,
    COMPACTION_FAILED,
    COMPACTION_FALLBACK,
    COMPACTION_START,
    DEACTIVATED,
    ERROR,
    EVENTS_DROPPED,
    REQUEST,
    RESPONSE,
    STOPPED,
    SUMMARIZER_ATTEMPT,
    SUMMARIZER_FALLBACK,
    TOOL_END,
    TOOL_START,
    TURN_END,
    TURN_START,
    Event,
)
from ..message import Message
from ..runtime import Runtime
from ..runtime.bus import Subscription
from ..state import State, validate_agent_id
from ..store import JournalReader, Store
from ..store.records import JournalRecord

POINTS = 400  # timeline entries kept per agent
TURNS = 8  # span trees kept per agent
BATCH = 0.05  # seconds the recorder lets events gather between batches
SPANS_PER_TURN = 200  # children of one turn kept (a turn with more shows how many were left out)
PLACEHOLDER = re.compile(r"\[[^\[\]\n]{1,120}, [0-9.]+ [KM]?B omitted")


Journal = JournalReader
"""The journal reads the page needs: any store's, or an `OffloadStore`'s."""


@attrs.frozen
class AgentRow:
    """One agent on the agents page."""

    name: str
    state: str  # running, idle, deactivated, failed, stopped; stored (from a store)
    tokens: int | None
    trigger: int | None
    window: int | None
    auto: int = 0
    forced: int = 0
    manual: int = 0
    failed: int = 0
    compactions: int = 0
    last: float | None = None  # wall-clock time of its last activity

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "tokens": self.tokens,
            "trigger": self.trigger,
            "window": self.window,
            "auto": self.auto,
            "forced": self.forced,
            "manual": self.manual,
            "failed": self.failed,
            "compactions": self.compactions,
            "last": self.last,
        }


class Span:
    """A piece of a turn's work, from the events that open and close it: their kinds and data
    are kept as they came (formatting waits for a page to show it: recording stays cheap)."""

    __slots__ = ("children", "data", "dropped", "end", "end_data", "error", "kind", "start")

    def __init__(self, kind: str, start: float, data: Any, end: float | None = None) -> None:
        self.kind = kind  # the opening event's kind
        self.start = start
        self.data = data  # the opening event's data
        self.end = end
        self.end_data: Any = None  # the closing event's data
        self.error = False
        self.children: list[Span] | None = None
        self.dropped = 0

    def add(self, child: Span) -> None:
        if self.children is None:
            self.children = [child]
        elif len(self.children) < SPANS_PER_TURN:
            self.children.append(child)
        else:
            self.dropped += 1


@attrs.define
class AgentLog:
    """What the recorder knows of one agent."""

    auto: int = 0
    forced: int = 0
    manual: int = 0
    failed: int = 0
    last: float | None = None  # wall clock
    tokens: int | None = None
    ended: str | None = None  # "failed", "stopped" once it stopped for good
    deactivated: bool = False
    points: deque[dict[str, Any]] = attrs.field(factory=lambda: deque(maxlen=POINTS))
    turns: deque[Span] = attrs.field(factory=lambda: deque(maxlen=TURNS))
    turn: Span | None = None
    open: dict[Any, Span] = attrs.field(factory=dict)  # open spans of the current turn
    attempts: int = 0  # summarizer attempts of the running compaction
    failed_attempts: int = 0
    fallbacks: list[str] = attrs.field(factory=list)


class Watcher:
    """One live page's view of the changes: the agents that changed since it last looked
    (a set, so a burst of events for one agent is one update) and a wake-up. Bounded by the
    number of agents; past `limit` it just asks for everything."""

    def __init__(self, agent: str | None, limit: int = 2_000) -> None:
        self.agent = agent
        self.changed: set[str] = set()
        self.everything = False
        self.limit = limit
        self._wake = trio.Event()

    def mark(self, name: str) -> None:
        if self.agent is not None and name != self.agent:
            return
        if not self.everything:
            self.changed.add(name)
            if len(self.changed) > self.limit:
                self.everything, self.changed = True, set()
        self._wake.set()

    def mark_all(self) -> None:
        self.everything, self.changed = True, set()
        self._wake.set()

    async def wait(self) -> tuple[bool, set[str]]:
        """Wait for a change; return (everything, the agents changed) and start over."""
        await self._wake.wait()
        self._wake = trio.Event()
        out = (self.everything, self.changed)
        self.everything, self.changed = False, set()
        return out


class Recorder:
    """Keeps per-agent figures from the event bus; see the module docstring."""

    def __init__(self, *, trace_all: bool = False) -> None:
        self.logs: dict[str, AgentLog] = {}
        self.watchers: set[Watcher] = set()
        self.dropped = 0
        self.trace_all = trace_all  # span trees of every agent's turns (the runtime traces anyway)
        self.traced: dict[str, int] = {}  # agents whose page is open: their turns' span trees
        self._offset = time.time() - _now()

    def add(self, watcher: Watcher) -> None:
        """A page starts watching; one agent's page also has that agent's span trees recorded."""
        self.watchers.add(watcher)
        if watcher.agent is not None:
            self.traced[watcher.agent] = self.traced.get(watcher.agent, 0) + 1

    def remove(self, watcher: Watcher) -> None:
        if watcher not in self.watchers:
            return
        self.watchers.discard(watcher)
        if watcher.agent is not None:
            left = self.traced.get(watcher.agent, 1) - 1
            if left > 0:
                self.traced[watcher.agent] = left
            else:
                self.traced.pop(watcher.agent, None)

    def tracing(self, name: str) -> bool:
        """Whether `name`'s turns get span trees: tracing is on, or its page is open."""
        return self.trace_all or name in self.traced

    def wall(self, t: float) -> float:
        """A trio clock time as wall-clock seconds."""
        return t + self._offset

    def log(self, name: str) -> AgentLog:
        log = self.logs.get(name)
        if log is None:
            log = self.logs[name] = AgentLog()
        return log

    async def run(self, subscription: Subscription) -> None:
        """Record the subscription's events until it ends: what has arrived, then a short
        sleep while more gather (one wake-up per batch, not one per event: an agent's turn
        pays for none); the pages' watchers hear once per batch which agents changed."""
        changed: set[str] = set()
        with subscription:
            while True:
                try:
                    changed.add(self.record(await subscription.receive()))
                    while True:
                        changed.add(self.record(subscription.receive_nowait()))
                except trio.WouldBlock:
                    self._tell(changed)
                    changed = set()
                    await trio.sleep(BATCH)
                except trio.EndOfChannel:
                    self._tell(changed)
                    return

    def _tell(self, changed: set[str]) -> None:
        changed.discard("")
        if self.watchers and changed:
            for w in self.watchers:
                for name in changed:
                    w.mark(name)

    def record(self, event: Event) -> str:
        """Take `event` into the figures; return its agent's name ("" for none)."""
        name = event.agent_id
        if name is None:
            if event.kind == EVENTS_DROPPED:
                self.dropped += int(event.data.get("count") or 0)
                for w in self.watchers:
                    w.mark_all()
            return ""
        log = self.logs.get(name)
        if log is None:
            log = self.logs[name] = AgentLog()
        now = event.time + self._offset if event.time else time.time()
        log.last = now
        handler = _handlers.get(event.kind)
        if handler is not None:
            handler(log, event, now)
        if self.trace_all or name in self.traced:
            spans = _spans.get(event.kind)
            if spans is not None:
                spans(log, event, now)
        return name


def _now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:
        return 0.0


# -- the figures: every event of these kinds ------------------------------------------------------


def _turn_start(log: AgentLog, event: Event, now: float) -> None:
    tokens = event.data.get("tokens")
    if isinstance(tokens, int):
        log.tokens = tokens
    log.points.append({"kind": "turn", "time": now, "tokens": log.tokens})


def _request(log: AgentLog, event: Event, now: float) -> None:
    tokens = event.data.get("tokens")
    if isinstance(tokens, int):
        log.tokens = tokens


def _compaction_start(log: AgentLog, event: Event, now: float) -> None:
    log.attempts = log.failed_attempts = 0
    log.fallbacks = []


def _compaction_end(log: AgentLog, event: Event, now: float) -> None:
    report = event.data.get("report")
    if not isinstance(report, CompactionReport):
        return
    reason = report.reason
    if reason == "forced":
        log.forced += 1
    elif reason == "manual":
        log.manual += 1
    else:
        log.auto += 1
    log.tokens = report.tokens_after
    log.points.append(
        {
            "kind": "compaction",
            "time": now,
            "reason": reason,
            "before": report.tokens_before,
            "after": report.tokens_after,
            "evicted": report.evicted,
            "first_seq": report.first_seq,
            "last_seq": report.last_seq,
            "compaction": report.compaction,
            "summarizer": report.summarizer,
            "attempts": report.attempts,
            "failed_attempts": log.failed_attempts,
            "fallback": report.fallback or (", ".join(log.fallbacks) or None),
            "passes": report.passes,
            "duration": report.duration,
        }
    )


def _compaction_failed(log: AgentLog, event: Event, now: float) -> None:
    log.failed += 1
    error = str(event.data.get("error"))
    log.points.append(
        {"kind": "failed", "time": now, "reason": event.data.get("reason"), "error": error, "tokens": log.tokens}
    )


def _attempt(log: AgentLog, event: Event, now: float) -> None:
    log.attempts += 1
    if not event.data.get("ok"):
        log.failed_attempts += 1


def _fallback(log: AgentLog, event: Event, now: float) -> None:
    log.fallbacks.append(str(event.data.get("fallback") or event.data.get("summarizer")))


# -- span trees: only for the agents `Recorder.tracing` names ---------------------------------------


def _span_turn_start(log: AgentLog, event: Event, now: float) -> None:
    log.turn = Span(TURN_START, now, event.data)
    log.open = {}


def _span_turn_end(log: AgentLog, event: Event, now: float) -> None:
    turn = log.turn
    if turn is None:
        return
    turn.end, turn.end_data = now, event.data
    turn.error = bool(event.data.get("aborted"))
    log.turns.append(turn)
    log.turn, log.open = None, {}


def _open(log: AgentLog, key: Any, span: Span, parent: Span | None = None) -> None:
    target = parent or log.turn
    if target is not None:
        target.add(span)
    if span.end is None:
        log.open[key] = span


def _close(log: AgentLog, key: Any, now: float, data: Any, error: bool = False) -> None:
    span = log.open.pop(key, None)
    if span is not None:
        span.end, span.end_data = now, data
        span.error = span.error or error


def _span_request(log: AgentLog, event: Event, now: float) -> None:
    _open(log, REQUEST, Span(REQUEST, now, event.data))


def _span_response(log: AgentLog, event: Event, now: float) -> None:
    _close(log, REQUEST, now, event.data)


def _span_tool_start(log: AgentLog, event: Event, now: float) -> None:
    _open(log, (TOOL_START, event.data.get("call_id")), Span(TOOL_START, now, event.data))


def _span_tool_end(log: AgentLog, event: Event, now: float) -> None:
    _close(log, (TOOL_START, event.data.get("call_id")), now, event.data, bool(event.data.get("error")))


def _span_compaction_start(log: AgentLog, event: Event, now: float) -> None:
    _open(log, COMPACTION_START, Span(COMPACTION_START, now, event.data))


def _span_compaction_end(log: AgentLog, event: Event, now: float) -> None:
    _close(log, COMPACTION_START, now, event.data, event.kind == COMPACTION_FAILED)


def _span_attempt(log: AgentLog, event: Event, now: float) -> None:
    span = Span(SUMMARIZER_ATTEMPT, now, event.data, end=now)
    span.error = not event.data.get("ok")
    _open(log, None, span, log.open.get(COMPACTION_START))


def _span_fallback(log: AgentLog, event: Event, now: float) -> None:
    _open(log, None, Span(event.kind, now, event.data, end=now), log.open.get(COMPACTION_START))


def _span_error(log: AgentLog, event: Event, now: float) -> None:
    if event.data.get("crashed") and log.turn is not None:
        log.turn.error = True


def _stopped(log: AgentLog, event: Event, now: float) -> None:
    reason = event.data.get("reason")
    log.ended = "failed" if reason in ("crashed", "failed") else "stopped"


def _deactivated(log: AgentLog, event: Event, now: float) -> None:
    log.deactivated = True


def _activated(log: AgentLog, event: Event, now: float) -> None:
    log.deactivated = False


_handlers = {
    TURN_START: _turn_start,
    REQUEST: _request,
    COMPACTION_START: _compaction_start,
    COMPACTION_END: _compaction_end,
    COMPACTION_FAILED: _compaction_failed,
    COMPACTION_FALLBACK: _fallback,
    SUMMARIZER_ATTEMPT: _attempt,
    SUMMARIZER_FALLBACK: _fallback,
    STOPPED: _stopped,
    DEACTIVATED: _deactivated,
    ACTIVATED: _activated,
}

_spans = {
    TURN_START: _span_turn_start,
    TURN_END: _span_turn_end,
    REQUEST: _span_request,
    RESPONSE: _span_response,
    TOOL_START: _span_tool_start,
    TOOL_END: _span_tool_end,
    COMPACTION_START: _span_compaction_start,
    COMPACTION_END: _span_compaction_end,
    COMPACTION_FAILED: _span_compaction_end,
    COMPACTION_FALLBACK: _span_fallback,
    SUMMARIZER_ATTEMPT: _span_attempt,
    SUMMARIZER_FALLBACK: _span_fallback,
    ERROR: _span_error,
}


@attrs.frozen
class AgentDetail:
    """One agent's page: its row, its context, its timeline and its last turns."""

    row: AgentRow
    messages: tuple[Message, ...] | None  # None: no state known (a journal without a checkpoint)
    points: tuple[dict[str, Any], ...]
    turns: tuple[Span, ...]
    journal: Journal | None
    live: bool
    traced: bool = False  # span trees are being recorded for it


def _thresholds(config: Any) -> tuple[int | None, int | None]:
    try:
        parsed = CompactConfig.from_mapping(config)
    except CmdcError:
        return None, None
    return parsed.token_trigger, parsed.context_window


class Source(Protocol):
    live: bool
    writable: bool
    title: str

    async def rows(self) -> list[AgentRow]: ...

    def rows_of(self, names: Iterable[str]) -> list[AgentRow]: ...

    async def detail(self, name: str) -> AgentDetail | None: ...

    def journal(self, name: str) -> Journal | None: ...

    async def compact(self, name: str) -> str: ...


class LiveSource:
    """A running runtime's agents (`Runtime.observe` gives their tasks without activating them)."""

    live = True

    def __init__(self, runtime: Runtime, recorder: Recorder, *, writable: bool = False) -> None:
        self.runtime = runtime
        self.recorder = recorder
        self.writable = writable
        self.title = "live runtime"
        self._thresholds: dict[int, tuple[Any, tuple[int | None, int | None]]] = {}
        self._journals: dict[str, Journal] = {}  # each agent's journal, as last seen resident

    def _limits(self, config: Any) -> tuple[int | None, int | None]:
        cached = self._thresholds.get(id(config))
        if cached is not None and cached[0] is config:
            return cached[1]
        figures = _thresholds(config)
        if len(self._thresholds) > 10_000:
            self._thresholds.clear()
        self._thresholds[id(config)] = (config, figures)
        return figures

    def row(self, name: str) -> AgentRow:
        log = self.recorder.logs.get(name)
        agent = self.runtime.observe(name)
        ref = self.runtime.whereis(name)
        tokens = trigger = window = None
        last = None
        if agent is not None:
            state = agent.state
            tokens = state.token_usage
            trigger, window = self._limits(state.config)
            window = window or agent.known_window
            last = self.recorder.wall(agent.last_active)
            status = "running" if agent.serving else "idle"
        elif ref is not None and ref.running:
            status = "deactivated"
        else:
            status = "failed" if log is not None and log.ended == "failed" else "stopped"
        if log is not None:
            if log.ended == "failed":
                status = "failed"
            if tokens is None:
                tokens = log.tokens
            last = log.last if last is None or (log.last is not None and log.last > last) else last
            return AgentRow(
                name,
                status,
                tokens,
                trigger,
                window,
                log.auto,
                log.forced,
                log.manual,
                log.failed,
                max(log.auto + log.forced + log.manual, agent.state.compactions if agent is not None else 0),
                last,
            )
        compactions = agent.state.compactions if agent is not None else 0
        return AgentRow(name, status, tokens, trigger, window, compactions=compactions, last=last)

    async def rows(self) -> list[AgentRow]:
        names = self.runtime.agents
        running = set(names)
        gone = [n for n, log in self.recorder.logs.items() if log.ended is not None and n not in running]
        return [self.row(n) for n in [*names, *gone[-100:]]]

    def rows_of(self, names: Iterable[str]) -> list[AgentRow]:
        return [self.row(n) for n in names]

    def journal(self, name: str) -> Journal | None:
        if self.runtime.store is not None:
            return self.runtime.store
        agent = self.runtime.observe(name)
        if agent is None:  # deactivated or stopped: where its journal was when last seen
            return self._journals.get(name)
        reader = agent.compactor.store_for(agent.compactor.compact_config(agent.state))
        if len(self._journals) > 10_000:
            self._journals.clear()
        self._journals[name] = reader
        return reader

    async def detail(self, name: str) -> AgentDetail | None:
        log = self.recorder.logs.get(name)
        if self.runtime.whereis(name) is None and log is None:
            return None
        agent = self.runtime.observe(name)
        messages: tuple[Message, ...] | None = None
        if agent is not None:
            messages = agent.state.messages
        elif self.runtime.checkpoints is not None:
            try:
                saved = await self.runtime.checkpoints.load(name)
            except CmdcError:
                saved = None
            messages = None if saved is None else saved.messages
        points = tuple(log.points) if log is not None else ()
        journal = self.journal(name)
        if not any(p["kind"] == "compaction" for p in points) and journal is not None:
            points = (*await journal_points(journal, name), *points)
        turns = tuple(log.turns) if log is not None else ()
        if log is not None and log.turn is not None:
            turns = (*turns, log.turn)
        return AgentDetail(self.row(name), messages, points, turns, journal, True, self.recorder.tracing(name))

    async def compact(self, name: str) -> str:
        ref = self.runtime.whereis(name)
        if ref is None:
            return f"no running agent is called {name}"
        outcome = await ref.compact()
        report = getattr(outcome, "report", None)
        if report is not None:
            return f"compacted: {report.tokens_before} -> {report.tokens_after} tokens"
        return f"skipped: {getattr(outcome, 'reason', '')}"


class StoreSource:
    """A store's agents, read-only: checkpoints (each agent's last state) and journals."""

    live = False
    writable = False

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reader: Journal = store
        self.title = str(store)
        self._cache: dict[str, tuple[float, AgentRow, State | None]] = {}

    async def names(self) -> list[str]:
        return await self.store.agents()

    async def _load(
        self, name: str, stamp: float | None = None, stamped: bool = False
    ) -> tuple[AgentRow, State | None]:
        if not stamped:
            stamp = (await self.store.written_at([name]))[0]
        cached = self._cache.get(name)
        if cached is not None and stamp is not None and cached[0] == stamp:
            return cached[1], cached[2]
        try:
            state = await self.store.checkpoints.load(name)
        except CmdcError:
            state = None
        if state is None:
            row = AgentRow(name, "journal only", None, None, None, last=stamp)
        else:
            trigger, window = _thresholds(state.config)
            row = AgentRow(
                name, "stored", state.token_usage, trigger, window, compactions=state.compactions, last=stamp
            )
        if stamp is not None:
            self._cache[name] = (stamp, row, state)
        return row, state

    async def rows(self) -> list[AgentRow]:
        names = await self.names()
        stamps = await self.store.written_at(names)  # one call for all
        rows: list[AgentRow | None] = [None] * len(names)
        limit = trio.Semaphore(8)  # checkpoints not cached yet are read 8 at a time

        async def load(i: int) -> None:
            async with limit:
                rows[i] = (await self._load(names[i], stamps[i], True))[0]

        async with trio.open_nursery() as nursery:
            for i, (name, stamp) in enumerate(zip(names, stamps, strict=True)):
                cached = self._cache.get(name)
                if cached is not None and stamp is not None and cached[0] == stamp:
                    rows[i] = cached[1]
                else:
                    nursery.start_soon(load, i)
        return [r for r in rows if r is not None]

    def rows_of(self, names: Iterable[str]) -> list[AgentRow]:
        return [c[1] for n in names if (c := self._cache.get(n)) is not None]

    def journal(self, name: str) -> Journal | None:
        return self.reader

    async def detail(self, name: str) -> AgentDetail | None:
        validate_agent_id(name)
        if name not in await self.names():
            return None
        row, state = await self._load(name)
        points = await journal_points(self.reader, name)
        return AgentDetail(row, None if state is None else state.messages, tuple(points), (), self.reader, False)

    async def compact(self, name: str) -> str:
        return "a store is shown read-only"


async def journal_points(journal: Journal, name: str) -> list[dict[str, Any]]:
    """The compactions a journal shows (what a store keeps without the events): per
    compaction, when, how many records and their estimated tokens, their range."""
    try:
        records = await journal.records(name, max_chars=0)
    except CmdcError:
        return []
    # A compaction's batch moves the compaction number; capped, masked and clipped results are
    # later batches numbered with the current one (no compaction: not shown as one). Records
    # without their attempt (PostgreSQL's) are grouped by number alone.
    groups: list[tuple[int, list[JournalRecord]]] = []
    batch: object = None
    last, taking = 0, False
    for r in records:
        key = (r.compaction, r.attempt) if r.attempt is not None else r.compaction
        if key != batch:
            batch, taking = key, r.compaction > 0 and r.compaction != last
            last = r.compaction
            if taking:
                groups.append((r.compaction, []))
        if taking:
            groups[-1][1].append(r)
    out = []
    for n, group in groups:
        chars = sum(r.clipped + len(r.message.text) for r in group)
        out.append(
            {
                "kind": "compaction",
                "time": group[-1].timestamp,
                "reason": "journal",
                "evicted": len(group),
                "evicted_tokens": chars // 4,
                "first_seq": group[0].seq,
                "last_seq": group[-1].seq,
                "compaction": n,
            }
        )
    return out


def badges(message: Message) -> list[str]:
    """What marks a message in the context view: pinned, summary, pointer, clipped, placeholder."""
    meta = message.metadata
    out = []
    if message.role == "system" or meta.get("cmdc.pinned"):
        out.append("pinned")
    if message.is_summary:
        out.append("summary")
    if meta.get("cmdc.pointer_only"):
        out.append("pointer only")
    if meta.get("cmdc.clipped_from"):
        out.append("preview (clipped)")
    kind = meta.get("cmdc.kind")
    if isinstance(kind, str) and kind not in ("summary",):
        out.append(kind)
    text = message.text
    if "omitted" in text and PLACEHOLDER.search(text[:200_000]):
        out.append("placeholder")
    return out


def summary_range(message: Message) -> tuple[int, int] | None:
    """The journal records a summary replaced (its `cmdc.first_seq`..`cmdc.last_seq`)."""
    first, last = message.metadata.get("cmdc.first_seq"), message.metadata.get("cmdc.last_seq")
    if isinstance(first, int) and isinstance(last, int) and 0 < first <= last:
        return first, last
    return None
