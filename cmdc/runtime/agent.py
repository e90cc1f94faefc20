"""The agent: one trio task that owns a `State`, serves its mailbox and runs turns.

A turn appends the user's messages, then per step: `before_request` plugins, `maybe_compact`,
the model request (a `ContextOverflow` forces a compaction and a retry, a bounded number of
times), `after_response` plugins, and the requested tools, run concurrently. The state is
committed at step boundaries only (a reply together with its tool results), so an abort, a
cancelled caller or a failure leaves the last committed state: never a call without its
results, never half a compaction.
"""

from __future__ import annotations

import contextvars
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import attrs
import trio

from .._report import Compacted
from ..compaction import Compactor
from ..compaction.tiers import apply_mask, cap_results, diagnose, evictable_gain, plan_mask
from ..compaction.tool import CompactionDesk, current_desk
from ..compaction.warm import AgentContext, set_agent_context
from ..errors import (
    AgentStopped,
    CheckpointError,
    CmdcError,
    CompactionAborted,
    CompactionError,
    CompactionIncomplete,
    CompactionThrashing,
    ConfigError,
    ContextOverflow,
    LeaseLost,
    MailboxFull,
    OffloadError,
    PluginAborted,
    ProviderError,
    RequestSkipped,
    StepLimitReached,
    TurnAborted,
)
from ..events import (
    COMPACTION_REQUESTED,
    COMPACTION_THRASH,
    CONTINUED,
    ERROR,
    OVERFLOW,
    PLUGIN_ERROR,
    QUEUED_DROPPED,
    REQUEST,
    RESPONSE,
    RESTART,
    RETRY,
    STOPPED,
    TOOL_CALLS_REFUSED,
    TOOL_RESULT_CAPPED,
    TOOL_RESULTS_MASKED,
    TURN_END,
    TURN_START,
    USAGE_REFUSED,
    Event,
)
from ..message import KIND_KEY, Message, ToolCall
from ..plugins import (
    Abort,
    AfterCompact,
    AfterResponse,
    BeforeCompact,
    BeforeRequest,
    Folded,
    HookName,
    LifecycleContext,
    OnError,
    OnStart,
    OnStop,
    Plugin,
    RequestContext,
    ResponseContext,
    Skip,
    ToolContext,
    fold,
    sort_plugins,
)
from ..providers.base import (
    CONTEXT_EXCEEDED_KEY,
    REFUSED_ARGUMENTS_KEY,
    STOP_REASON_KEY,
    ModelRequest,
    Provider,
)
from ..state import State
from ..tools import Tool, ToolSet
from ..tracing import UNTRACED, Span, Tracer
from .mailbox import (
    Call,
    Compact,
    Deactivate,
    Prompt,
    Send,
    _Crash,
    _DeactivateNow,
    _StopRequested,
    begun,
    check_system,
    current_chain,
)
from .options import AgentOptions, RestartPolicy
from .ref import AgentRef, Host
from .tool_calls import ToolCalls

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from ..store import Checkpoints
    from .bus import EventBus

MAX_PLAUSIBLE_TOKENS = 100_000_000
"""A usage figure past this many tokens is refused (no model has a window near it)."""
T = TypeVar("T")
C = TypeVar("C")

CONTINUE_KIND = "continue"
"""`cmdc.kind` of the user message that asks the model to go on with a reply the window cut off."""
CONTINUE_PROMPT = (
    "[Your previous reply was cut off because the context window was full. The conversation has "
    "been compacted. Continue your reply exactly where it stopped, without repeating it.]"
)
CONTINUED_FROM_KEY = "cmdc.continued_from"
"""On the reply a turn returns after continuations: the ids of the cut-off pieces before it
(its text is theirs joined with its own; the state holds each piece)."""
WINDOW_SLACK = 8
"""A reply whose prompt + output came within this many tokens of the window filled it."""


class _KeepTheQuestion(Plugin):
    """Built in: no compaction during a turn summarizes away the user's current question
    (the last user message that started the turn). It is kept out of what is evicted; if the
    compactor still had to evict it (a pin over its budget), it is put back right after the
    summary, where it belongs in time. A question too large for the model then ends the turn
    with `ContextOverflow`, never with an answer to a summary of it."""

    priority = -(2**31)  # first: later plugins see the question already kept
    hook_timeout = None

    def __init__(self) -> None:
        self.question: Message | None = None

    async def before_compact(self, ctx: BeforeCompact) -> Sequence[Message] | None:
        q = self.question
        if q is None or all(m.id != q.id for m in ctx.evicted):
            return None
        return tuple(m for m in ctx.evicted if m.id != q.id)

    async def after_compact(self, ctx: AfterCompact) -> State | None:
        q = self.question
        if q is None or any(m.id == q.id for m in ctx.state.messages):
            return None
        return ctx.state.insert_after_summary(q)


class Agent(ToolCalls):
    """The agent task's state and loop. Users see it through an `AgentRef`."""

    __slots__ = (
        "_done_event",
        "_receive",
        "_send",
        "aborted",
        "activated",
        "bus",
        "checkpointed",
        "checkpoints",
        "compact_next",
        "compact_reason",
        "compacted_at",
        "compaction_resume_at",
        "compactor",
        "current",
        "deactivating",
        "done",
        "futile",
        "in_flight",
        "known_window",
        "last_active",
        "leaving",
        "mask_hint",
        "name",
        "on_active",
        "on_exit",
        "options",
        "own_tools",
        "pending",
        "plugins",
        "provider",
        "question",
        "ref",
        "request_count",
        "restart_count",
        "saved",
        "serving",
        "state",
        "toolsets",
        "tracer",
        "turn_scope",
    )

    def __init__(
        self,
        *,
        name: str,
        state: State,
        provider: Provider,
        compactor: Compactor,
        tools: Iterable[Tool | ToolSet],
        plugins: Iterable[Plugin],
        options: AgentOptions,
        bus: EventBus,
        checkpoints: Checkpoints | None = None,
        on_exit: Callable[[Agent], None] | None = None,
        ref: AgentRef | None = None,
        activated: bool = False,
        saved: State | None = None,
        on_active: Callable[[Agent], None] | None = None,
        tracer: Tracer | None = None,
        host: Host | None = None,
    ) -> None:
        """`ref`: the handle of an agent activated again (it is bound to this task); None: a new
        handle, whose `host` (a runtime with virtual agents) activates it when not resident."""
        self.name = name
        self.tracer = tracer  # None: no tracing work at all
        self.on_exit = on_exit
        self.on_active = on_active
        # activated: a virtual agent brought back from the store (on_start ran at its spawn)
        self.activated = activated
        self.saved = saved  # the state last written to the checkpoint store (or one as good)
        self.checkpointed = False  # whether this task has written a checkpoint
        self.deactivating = False
        self.leaving = False  # a deactivation was asked for and not yet refused
        self.serving = False
        self.last_active = trio.current_time()
        self.state = state
        self.provider = provider
        self.compactor = compactor
        self.question = _KeepTheQuestion()
        compactor.add_plugin(self.question)
        self.own_tools: dict[str, Tool] = {}
        toolsets: list[ToolSet] = []
        for t in tools:
            if isinstance(t, ToolSet):
                toolsets.append(t)
                continue
            if not isinstance(t, Tool):
                raise ConfigError(f"tools must be cmdc Tool values (use @cmdc.tool), got {t!r:.80}")
            if t.name in self.own_tools:
                raise ConfigError(f"two tools are named {t.name!r}")
            self.own_tools[t.name] = t
        self.toolsets = tuple(toolsets)
        self._seen: tuple[int, ...] = ()  # the toolsets' versions the view below was built from
        self._tools = self.own_tools
        self._schemas = tuple(t.schema for t in self.own_tools.values())
        self.plugins = sort_plugins(plugins)
        self.options = options
        self.bus = bus
        self.checkpoints = checkpoints
        self._send, self._receive = trio.open_memory_channel[Any](options.mailbox_size)
        self.pending: list[Message] = []  # sent messages waiting for the next turn
        self.in_flight = 0  # messages sent with send() still in the mailbox
        self.turn_scope: trio.CancelScope | None = None
        self.current: Prompt | None = None
        self.aborted = False
        self.done = False
        self._done_event: trio.Event | None = None  # made only when someone waits for the end
        self.restart_count = 0
        self.compaction_resume_at = -math.inf
        self.compact_next = False
        self.compact_reason: str | None = None  # the model asked for a compaction (compact_context)
        self.request_count = 0  # model requests made by this task (the thrash guard's clock)
        self.compacted_at: deque[int] = deque()  # the request count at each compaction
        self.futile = 0  # compactions in a row that left the context over a trigger
        self.mask_hint: tuple[int, int] | None = None  # (tokens, freed) of the last plan not worth it
        self.known_window: int | None = None  # the window the last ContextOverflow reported
        if ref is None:
            self.ref = AgentRef(self, host)
        else:
            self.ref = ref
            ref.bind(self)

    # -- the mailbox ------------------------------------------------------------------------
    def _reserve(self, request: Any) -> int:
        """Count the messages of a `Send` against `max_queued` (MailboxFull past it)."""
        if not isinstance(request, Send):
            return 0
        n = len(request.messages)
        if self.in_flight + len(self.pending) + n > self.options.max_queued:
            raise MailboxFull(
                f"agent {self.name!r}: {self.in_flight + len(self.pending)} messages already queued "
                f"(max_queued={self.options.max_queued})"
            )
        self.in_flight += n
        return n

    async def enqueue(self, request: Any) -> None:
        n = self._reserve(request)
        try:
            await self._send.send(request)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.in_flight -= n
            raise AgentStopped(f"agent {self.name!r} has stopped") from None
        except BaseException:  # cancelled while waiting for room: nothing was sent
            self.in_flight -= n
            raise

    def enqueue_nowait(self, request: Any) -> None:
        n = self._reserve(request)
        try:
            self._send.send_nowait(request)
        except trio.WouldBlock:
            self.in_flight -= n
            raise MailboxFull(f"agent {self.name!r}: mailbox full ({self.options.mailbox_size} requests)") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.in_flight -= n
            raise AgentStopped(f"agent {self.name!r} has stopped") from None

    async def wait(self, request: Prompt | Call | Compact) -> Any:
        try:
            return await request.reply.wait()
        finally:
            if not request.reply.done:  # the caller gave up (cancelled): so does the turn
                request.reply.abandoned = True
                if self.current is request and self.turn_scope is not None:
                    self.turn_scope.cancel()

    async def wait_done(self) -> None:
        if not self.done:
            if self._done_event is None:
                self._done_event = trio.Event()
            await self._done_event.wait()

    def add_plugin(self, plugin: Plugin) -> None:
        self.plugins = sort_plugins((*self.plugins, plugin))
        self.compactor.add_plugin(plugin)

    # -- the task -----------------------------------------------------------------------------
    async def main(self, *, task_status: trio.TaskStatus[AgentRef] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the mailbox until stopped; after a crash, go on from the last committed state
        as the restart policy says."""
        crashes: deque[float] | None = None
        ended = "cancelled"  # why the task ends, for the `stopped` event
        try:
            if not self.activated:
                await self._lifecycle("on_start", OnStart(self.state))
            task_status.started(self.ref)
            async for request in self._receive:
                self.serving = True
                try:
                    await self._serve(request)
                except (_StopRequested, _DeactivateNow):
                    ended = "stopped"
                    return
                except _Crash as crash:
                    error = crash.__cause__ or crash
                    self._emit(ERROR, error=repr(error), during="turn", crashed=True)
                    now = trio.current_time()
                    crashes = crashes if crashes is not None else deque()
                    crashes.append(now)
                    while crashes and crashes[0] < now - self.options.restart_window:
                        crashes.popleft()
                    if self.options.restart == "temporary":
                        ended = "crashed"
                        return
                    if len(crashes) > self.options.max_restarts:
                        if self.options.restart == "transient":
                            gave_up = f"agent {self.name} gave up after {len(crashes)} crashes"
                            self._emit(ERROR, error=gave_up, during="restart")
                            ended = "crashed"
                            return
                        await trio.sleep(self.options.restart_window)  # permanent: back off, go on
                        crashes.clear()
                    self.restart_count += 1
                    self._emit(RESTART, restarts=self.restart_count)
                finally:
                    self.serving = False
                    self.last_active = trio.current_time()
                    if self.on_active is not None:
                        self.on_active(self)
            ended = "closed"  # the mailbox ended
        except Exception as exc:  # a bug here must never take the runtime down
            ended = "failed"
            self._emit(ERROR, error=f"agent task failed: {exc!r}", during="agent")
        finally:
            self._send.close()
            self._fail_queued()  # before the receive side closes: queued callers get an answer
            self._receive.close()
            if not self.deactivating:
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await self._lifecycle("on_stop", OnStop(self.state))
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self.compactor.aclose()  # the store it opened (if any) is its to close
            self.done = True
            if self._done_event is not None:
                self._done_event.set()
            if not self.deactivating and ended != "cancelled":
                # Stopped for good while the runtime runs (a deactivated agent is still running;
                # a closing runtime ends every subscription itself): its last event, then its
                # subscriptions end (`async for` finishes).
                self._emit(STOPPED, reason=ended, restarts=self.restart_count)
                self.bus.end_agent(self.name)
            if self.on_exit is not None:
                self.on_exit(self)

    def _fail_queued(self) -> None:
        error = AgentStopped(f"agent {self.name!r} stopped before answering")
        if self.current is not None:
            self.current.reply.fail(error)
        while True:
            try:
                request = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            if isinstance(request, (Prompt, Call, Compact, Deactivate)):
                request.reply.fail(error)

    async def _serve(self, request: Any) -> None:
        if isinstance(request, Send):
            self.in_flight -= len(request.messages)
            self.pending.extend(request.messages)
        elif isinstance(request, Call):
            try:
                request.reply.set(request.fn(self))
            except _StopRequested:
                request.reply.set(None)
                raise
        elif isinstance(request, Compact):
            await self._serve_compact(request)
        elif isinstance(request, Deactivate):
            await self._serve_deactivate(request)
        elif not request.reply.abandoned:
            await self._serve_prompt(request)

    def idle(self) -> bool:
        """Nothing to do: no request being served, queued, or waiting for mailbox room."""
        stats = self._receive.statistics()
        return not self.serving and stats.current_buffer_used == 0 and stats.tasks_waiting_send == 0

    def _idle_now(self) -> bool:  # the same, from inside the task serving a request
        stats = self._receive.statistics()
        return stats.current_buffer_used == 0 and stats.tasks_waiting_send == 0

    async def _serve_deactivate(self, request: Deactivate) -> None:
        """End the task if still idle, its state saved: the runtime can activate it again."""
        if self.checkpoints is None or not self._idle_now():
            self.leaving = False
            request.reply.set(False)
            return
        if self.state is not self.saved:
            try:
                await self._commit(self.state, took_pending=False)
            except CheckpointError as exc:
                self._emit(ERROR, error=repr(exc), during="deactivation")
                self.leaving = False
                request.reply.set(False)
                self._check_lease(exc)
                return
        if not self._idle_now():  # a request came while the state was saved
            self.leaving = False
            request.reply.set(False)
            return
        # From here to the mailbox's closing there is no checkpoint: nothing can slip in.
        self.deactivating = True
        request.reply.set(True)
        raise _DeactivateNow

    async def _serve_compact(self, request: Compact) -> None:
        if request.reply.abandoned:
            return
        try:
            with self._compaction_span("manual", self.state, request.context) as span:
                outcome = await self.compactor.force_compact(
                    self.state, instruction=request.instruction, reason="manual"
                )
                span.record(outcome)
            if isinstance(outcome, Compacted):
                await self._commit(outcome.state, took_pending=False)
            request.reply.set(outcome)
        except CompactionIncomplete as exc:
            await self._commit(exc.state, took_pending=False)
            request.reply.fail(exc)
        except CmdcError as exc:
            request.reply.fail(exc)
            self._check_lease(exc)

    async def _serve_prompt(self, request: Prompt) -> None:
        self.current, self.aborted = request, False
        token = current_chain.set((*request.chain, self.name))
        try:
            with trio.CancelScope() as scope:
                self.turn_scope = scope
                try:
                    with self._turn_span(request) as span:
                        reply = await self._turn(request.messages)
                        span.record(reply)
                except Exception as exc:
                    if self.pending:  # taken by the failed turn, never committed: dropped, said so
                        dropped, self.pending = len(self.pending), []
                        exc.add_note(f"{dropped} message(s) queued with send() were dropped with this turn")
                        self._emit(QUEUED_DROPPED, count=dropped, error=repr(exc))
                    request.reply.fail(exc)
                    self._emit(ERROR, error=repr(exc), during="turn")
                    await self._lifecycle("on_error", OnError(self.state, exc))
                    self._check_lease(exc)
                    if not isinstance(exc, CmdcError):
                        raise _Crash(repr(exc)) from exc
                else:
                    request.reply.set(reply)
            if scope.cancelled_caught:
                why = "aborted" if self.aborted else "cancelled by its caller"
                request.reply.fail(TurnAborted(f"agent {self.name!r}: turn {why}; state kept at the last commit"))
                self._emit(TURN_END, aborted=True, reason=why)
        finally:
            current_chain.reset(token)
            self.turn_scope, self.current = None, None
            # Cancelled from outside (the runtime closing): the caller must not hang.
            request.reply.fail(AgentStopped(f"agent {self.name!r} stopped during the turn"))

    def _check_lease(self, exc: BaseException) -> None:
        """After `LeaseLost` (another runtime holds the name now), leave memory without saving:
        the next call activates the agent again from the store, where the new owner wrote."""
        if isinstance(exc, LeaseLost):
            self.deactivating = True
            self.checkpointed = True  # what it had is in the store, not a new State
            raise _DeactivateNow

    # -- the turn -------------------------------------------------------------------------------
    async def _commit(self, state: State, *, took_pending: bool = True) -> None:
        """Make `state` the committed state. `took_pending`: it holds the messages queued with
        `send` (a turn's state does; a deactivation's or a manual compaction's does not, and
        they stay queued for the next turn)."""
        if self.checkpoints is not None:
            # Shielded: the checkpoint on disk and the state in memory never disagree.
            with trio.CancelScope(shield=True):
                await self.checkpoints.save(state)
            self.saved, self.checkpointed = state, True
        self.state = state
        if took_pending:
            self.pending.clear()
        await self.commit_journal(state)

    async def commit_journal(self, state: State) -> None:
        """The state is committed: so are the journal attempts of its compactions (a no-op when
        they are already). A failure is reported; a restart, or the next compaction (its batch
        holds this summary), commits them again."""
        if self.compactor.options.commit_journal:
            return
        try:
            with trio.CancelScope(shield=True):
                await self.compactor.commit(state)
        except CmdcError as exc:
            self._emit(ERROR, error=repr(exc), during="journal commit")

    async def _turn(self, incoming: tuple[Message, ...]) -> Message:
        started = trio.current_time()
        check_system(begun(self.state.messages[-1:]), (*self.pending, *incoming))
        self.question.question = next((m for m in reversed(incoming) if m.role == "user"), None)
        try:
            return await self._turn_steps(started, self.state.append(*self.pending, *incoming))
        finally:
            self.question.question = None

    async def _turn_steps(self, started: float, state: State) -> Message:
        self._emit(TURN_START, messages=len(state.messages), tokens=state.token_usage)
        reply: Message | None = None
        parts: list[Message] = []  # the pieces of a reply cut off by the window, in order
        for step in range(1, self.options.max_steps + 1):
            state = await self._before_request(state, step)
            state = await self._maybe_compact(state)
            state, reply = await self._request(state)
            reply = await self._after_response(state, reply)
            cut = self._cut_by_window(state, reply)
            if cut is not None:
                self.compact_next = True  # the model ran out of room: compact before the next step
            if reply.tool_calls:
                results = await self._run_tools(state, reply)
                state, results = await self._cap(state, reply, results)
                state = state.append(reply, *results)
                await self._commit(state)
                continue
            if cut is not None and len(parts) < self.options.max_continuations:
                # Cut off by the full window, not finished: keep what it wrote, compact, and ask
                # it to go on, rather than return half an answer as final.
                parts.append(reply)
                state = state.append(reply, Message.user(CONTINUE_PROMPT, metadata={KIND_KEY: CONTINUE_KIND}))
                await self._commit(state)
                self._emit(CONTINUED, continuation=len(parts), **cut)
                continue
            state = state.append(reply)
            await self._commit(state)
            self._emit(TURN_END, steps=step, duration=trio.current_time() - started, usage=reply.usage)
            if parts:  # the whole answer; the state holds each piece
                return Message.assistant(
                    "".join(p.text for p in parts) + reply.text,
                    usage=reply.usage,
                    metadata={**reply.metadata, CONTINUED_FROM_KEY: tuple(p.id for p in parts)},
                )
            return reply
        raise StepLimitReached(
            f"agent {self.name!r}: no final answer after {self.options.max_steps} steps", reply=reply
        )

    def _cut_by_window(self, state: State, reply: Message) -> dict[str, Any] | None:
        """The figures of a reply that stopped because the context window was full (None when
        it finished, or stopped on its own output limit): the provider said so
        (`cmdc.context_exceeded`), or it stopped on `length`/`max_tokens` with prompt + output
        at the window (configured `context_window`, else the last overflow's)."""
        stop = reply.metadata.get(STOP_REASON_KEY)
        usage = reply.usage
        window = self.compactor.compact_config(state).context_window or self.known_window
        total = usage.total_tokens if usage is not None else None
        if reply.metadata.get(CONTEXT_EXCEEDED_KEY):
            return {"stop_reason": stop, "tokens": total, "window": window}
        if stop not in ("length", "max_tokens") or total is None or window is None:
            return None
        if total < window - WINDOW_SLACK:
            return None
        return {"stop_reason": stop, "tokens": total, "window": window}

    async def _maybe_compact(self, state: State) -> State:
        """The automatic compaction before a request (forced when the last reply said the
        model's window was exhausted, `cmdc.context_exceeded`). If it fails (the summarizer or the disk),
        the request goes ahead uncompacted and automatic compaction rests for
        `compaction_cooldown` seconds; an overflow still forces one."""
        forced, self.compact_next = self.compact_next, False
        requested, self.compact_reason = self.compact_reason, None
        # A compaction in this task may ask the summary on this agent's cached prefix.
        set_agent_context(AgentContext(self.provider, self.tool_schemas))
        state = await self._mask(state)
        if not forced and requested is None and trio.current_time() < self.compaction_resume_at:
            return state
        # Only size counts for the guard: a `messages` trigger refills by design, one step at a time.
        sized = forced or requested is not None or self._over_tokens(state)
        if sized or self.compactor.should_compact(state):
            self._guard(state)
        try:
            with self._compaction_span("forced" if forced else "auto", state, due=forced) as span:
                if forced:
                    outcome = await self.compactor.force_compact(state)
                elif requested is not None:
                    instruction = f"The agent asked for this compaction, for this reason: {requested}"
                    outcome = await self.compactor.force_compact(state, instruction=instruction, reason="requested")
                else:
                    outcome = await self.compactor.maybe_compact(state)
                span.record(outcome)
        except CompactionAborted:
            raise  # a plugin's Abort ends the turn with the error
        except CompactionIncomplete as exc:  # compacted, yet still over a trigger: keep the gain
            if sized:
                self.compacted_at.append(self.request_count)
            self.futile += 1
            self.compaction_resume_at = trio.current_time() + self.options.compaction_cooldown
            self._emit(ERROR, error=str(exc), during="compaction", retry_in=self.options.compaction_cooldown)
            return exc.state
        except (CompactionError, OffloadError) as exc:
            self.compaction_resume_at = trio.current_time() + self.options.compaction_cooldown
            self._emit(ERROR, error=repr(exc), during="compaction", retry_in=self.options.compaction_cooldown)
            return state
        if isinstance(outcome, Compacted):
            if sized:
                self.compacted_at.append(self.request_count)
            self.futile = 0
        return outcome.state

    def _over_tokens(self, state: State) -> bool:
        trigger = self.compactor.compact_config(state).token_trigger
        return trigger is not None and self.compactor.estimate_tokens(state) >= trigger

    # -- the cheap tiers (see cmdc.compaction.tiers) and the thrash guard -----------------------
    async def _cap(self, state: State, reply: Message, results: list[Message]) -> tuple[State, list[Message]]:
        """Tool results over their limit: journaled whole (durably) first, then a preview in
        their place. If the journal fails, the results stay whole (nothing is lost; an error
        event says so)."""
        config = self.compactor.compact_config(state)
        calls = {c.id: c for c in reply.tool_calls}
        try:
            store = self.compactor.store_for(config)
            capped, state, done = await cap_results(store, state, config, calls, results, self.compactor.count)
        except OffloadError as exc:
            self._emit(ERROR, error=repr(exc), during="tool result cap")
            return state, results
        for figures in done:
            self._emit(TOOL_RESULT_CAPPED, **figures)
        return state, capped

    async def _mask(self, state: State, *, overflow: bool = False) -> State:
        """Past the soft threshold, old tool results masked in one batch (journaled first),
        when the batch frees at least `mask_at_least` tokens. After an overflow (`overflow`),
        whatever masking frees: it is cheaper than a forced compaction."""
        config = self.compactor.compact_config(state)
        tiers, trigger = config.tiers, config.token_trigger
        if not tiers.mask_tool_results or (trigger is None and not overflow):
            return state
        tokens = self.compactor.estimate_tokens(state)
        if not overflow and trigger is not None and tokens < trigger * tiers.mask_trigger:
            return state
        # The last plan freed too little at `hint[0]` tokens; one now frees at most that plus
        # what came since: until that could be enough, nothing is planned (O(1) per step).
        hint = self.mask_hint
        hopeless = hint is not None and hint[0] <= tokens and hint[1] + tokens - hint[0] < tiers.gain(trigger)
        if not overflow and hopeless:
            return state
        plan = plan_mask(state, config, self.compactor.count)
        if not plan.indices or (not overflow and trigger is not None and plan.freed < tiers.gain(trigger)):
            self.mask_hint = (tokens, plan.freed)
            return state
        self.mask_hint = None
        try:
            masked, records = await apply_mask(self.compactor.store_for(config), state, plan)
        except OffloadError as exc:
            self._emit(ERROR, error=repr(exc), during="masking")
            return state
        after = self.compactor.estimate_tokens(masked)
        freed = tokens - after
        self._emit(TOOL_RESULTS_MASKED, masked=len(plan.indices), freed=freed, tokens_before=tokens, records=records)
        return masked

    def _guard(self, state: State) -> None:
        """The thrash guard: `compact_thrash` = (n, m); n compactions within the last m model
        requests already, and the context over the trigger again: stop, say what is too big."""
        config = self.compactor.compact_config(state)
        n, m = config.tiers.thrash
        while self.compacted_at and self.compacted_at[0] < self.request_count - m:
            self.compacted_at.popleft()
        if len(self.compacted_at) < n and self.futile < n:
            return
        budget = self.compactor.budgets(config, self.known_window)[0]
        task = None
        if self.compactor.options.pin_task:
            task = next((x.id for x in state.messages if x.role == "user" and not x.is_summary), None)
        culprit, advice, figures = diagnose(state, config, self.compactor.count, budget, task)
        count = max(len(self.compacted_at), self.futile)
        how = f"within {m} model requests" if len(self.compacted_at) >= n else "in a row, each left over the trigger"
        self._emit(COMPACTION_THRASH, compactions=count, requests=m, culprit=culprit, figures=figures)
        self.compacted_at.clear()
        self.futile = 0
        raise CompactionThrashing(
            f"agent {self.name!r}: {count} compactions {how}, and the context (~{figures['tokens']} tokens) is "
            f"over the compaction trigger ({figures['trigger']} tokens) again; stopped instead of compacting once "
            f"more. Too big: {advice}. Figures: pins "
            f"{figures['pins']}, kept {figures['kept']}, largest message {figures['largest_message']}, "
            f"summary budget {figures['summary_budget']} tokens (compact_thrash={n, m}).",
            culprit=culprit,
            figures=figures,
        )

    def _desk(self, state: State) -> CompactionDesk:
        """What the `compact_context` tool may ask during this step's tool calls."""

        def estimate() -> tuple[int, int]:
            config = self.compactor.compact_config(state)
            budget = self.compactor.budgets(config, self.known_window)[0]
            gain = evictable_gain(state, config, self.compactor.count, budget)
            return gain, config.tiers.min_gain_for(config.token_trigger)

        def report(reason: str, gain: int, minimum: int, accepted: bool) -> None:
            self._emit(COMPACTION_REQUESTED, reason=reason, estimated_gain=gain, min_gain=minimum, accepted=accepted)

        return CompactionDesk(estimate, report)

    async def _request(self, state: State) -> tuple[State, Message]:
        """The model request. On `ContextOverflow`: forced compactions (at most
        `max_forced_compactions`), then once, clipping the trailing tool results (journaled
        whole first); then the overflow reaches the caller with its figures."""
        forced, clipped = 0, False
        set_agent_context(AgentContext(self.provider, self.tool_schemas))
        while True:
            request = ModelRequest(state.messages, self.tool_schemas, self.options.max_output_tokens)
            self.request_count += 1
            self._emit(REQUEST, messages=len(state.messages), tokens=state.token_usage)
            t0 = trio.current_time()
            try:
                with self._request_span(request) as span:
                    reply = await self.provider.complete(request)
                    span.record(reply)
            except ContextOverflow as exc:
                self._emit(OVERFLOW, prompt_tokens=exc.prompt_tokens, limit=exc.limit, forced=forced)
                if exc.limit:
                    self.known_window = exc.limit
                why = f"still too long after {forced} forced compactions"
                masked = await self._mask(state, overflow=True)
                if masked is not state:  # cheap before expensive: masked, then retried
                    state = masked
                    self._emit(RETRY, after="overflow", forced=forced)
                    continue
                if forced < self.options.max_forced_compactions:
                    self._guard(state)
                    try:
                        with self._compaction_span("forced", state) as span:
                            outcome = await self.compactor.force_compact(state, window=exc.limit)
                            span.record(outcome)
                    except CompactionIncomplete as incomplete:
                        outcome = Compacted(incomplete.state, incomplete.report)
                        self.futile += 1
                    if isinstance(outcome, Compacted):
                        self.compacted_at.append(self.request_count)
                        forced += 1
                        state = outcome.state
                        self._emit(RETRY, after="overflow", forced=forced)
                        continue
                    why = f"nothing more can be compacted ({outcome.reason})"
                if not clipped:
                    clipped = True
                    smaller = await self.compactor.clip_tail(state)
                    if smaller is not None:
                        state = smaller
                        self._emit(RETRY, after="overflow", clipped=True)
                        continue
                raise ContextOverflow(
                    f"agent {self.name!r}: prompt too long and {why}: {exc}",
                    prompt_tokens=exc.prompt_tokens,
                    limit=exc.limit,
                ) from exc
            if not isinstance(reply, Message) or reply.role != "assistant":
                raise ProviderError(f"provider returned {reply!r:.80}, not an assistant Message")
            reply = self._plausible_usage(state, reply)
            self._emit(RESPONSE, usage=reply.usage, duration=trio.current_time() - t0, tool_calls=len(reply.tool_calls))
            return state, reply

    def _plausible_usage(self, state: State, reply: Message) -> Message:
        """The reply, without its usage if a figure is beyond belief (past `MAX_PLAUSIBLE_TOKENS`,
        or a total past twice the configured `context_window`): a `usage_refused` event says
        so, and the context's size is estimated until the next plausible report."""
        usage = reply.usage
        if usage is None:
            return reply
        window = self.compactor.compact_config(state).context_window
        limit = MAX_PLAUSIBLE_TOKENS if window is None else min(MAX_PLAUSIBLE_TOKENS, 2 * window)
        figures = (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_creation_tokens)
        if usage.total_tokens <= limit and max(figures) <= MAX_PLAUSIBLE_TOKENS:
            return reply
        self._emit(USAGE_REFUSED, usage=usage, limit=limit)
        return reply.evolve(usage=None)

    # -- plugins --------------------------------------------------------------------------------
    def _plugin_error(self, hook: str) -> Callable[[Plugin, BaseException], None]:
        def report(plugin: Plugin, exc: BaseException) -> None:
            self._emit(PLUGIN_ERROR, plugin=plugin.name, hook=hook, error=repr(exc))

        return report

    async def _hook(self, hook: HookName, ctx: C, subject: T, rebind: Callable[[C, T], C]) -> Folded[T]:
        """Fold `hook` over the plugins; an `Abort` ends the turn with `PluginAborted`."""
        folded = await fold(self.plugins, hook, ctx, subject, rebind=rebind, on_error=self._plugin_error(hook))
        if isinstance(folded.stop, Abort):
            raise PluginAborted(f"plugin {folded.stopped_by} aborted the turn: {folded.stop.reason}")
        return folded

    async def _before_request(self, state: State, step: int) -> State:
        folded = await self._hook(
            "before_request", BeforeRequest(state, step), state, lambda ctx, s: BeforeRequest(s, step)
        )
        if isinstance(folded.stop, Skip):
            raise RequestSkipped(f"plugin {folded.stopped_by} skipped the request: {folded.stop.reason}")
        return folded.value

    async def _after_response(self, state: State, reply: Message) -> Message:
        folded = await self._hook(
            "after_response", AfterResponse(state, reply), reply, lambda ctx, r: AfterResponse(state, r)
        )
        return folded.value

    async def _lifecycle(
        self, hook: Literal["on_start", "on_error", "on_stop"], ctx: OnStart | OnError | OnStop
    ) -> None:
        """`on_start` may replace the state; `on_error` and `on_stop` observe. `Skip` and
        `Abort` only end the fold here."""
        if not any(p.implements(hook) for p in self.plugins):
            return
        folded = await fold(
            self.plugins,
            hook,
            ctx,
            self.state,
            rebind=lambda c, s: attrs.evolve(c, state=s),
            on_error=self._plugin_error(hook),
        )
        if folded.value is not self.state:
            self.state = folded.value

    # -- tools (see ToolCalls) -------------------------------------------------------------------
    async def _run_tools(self, state: State, reply: Message) -> list[Message]:
        calls, limit = reply.tool_calls, self.options.max_parallel_tools
        results: list[Message | None] = [None] * len(calls)
        aborted: list[PluginAborted] = []
        if len(calls) > limit:  # bounded fan-out: the excess is refused, readably
            why = (
                f"not run: this reply made {len(calls)} tool calls and at most {limit} run per step "
                f"(the first {limit} ran). Make this call again in a later step if it is still needed."
            )
            for i in range(limit, len(calls)):
                results[i] = Message.tool_result(calls[i].id, why, is_error=True)
            self._emit(TOOL_CALLS_REFUSED, refused=len(calls) - limit, limit=limit)
        refused = reply.metadata.get(REFUSED_ARGUMENTS_KEY)
        refused = refused if isinstance(refused, Mapping) else {}
        desk = self._desk(state)
        token = current_desk.set(desk)  # copied into each tool's task: compact_context finds it
        try:
            async with trio.open_nursery() as nursery:
                for i, call in enumerate(calls[:limit]):
                    reason = refused.get(call.id)
                    if isinstance(reason, str):  # the provider did not keep its arguments: never run
                        results[i] = Message.tool_result(
                            call.id, f"tool {call.name!r} not run: {reason}", is_error=True
                        )
                        continue
                    nursery.start_soon(self._run_tool, state, call, results, i, aborted, nursery.cancel_scope)
        finally:
            current_desk.reset(token)
        if desk.reason is not None:
            self.compact_reason = desk.reason
        if aborted:  # raised here, not inside the nursery: the caller gets PluginAborted itself
            raise aborted[0]
        return results  # type: ignore[return-value]  # every slot is filled once the nursery closes

    # -- tracing (see cmdc.tracing): without a tracer, each of these is one `is None` test ------
    def _turn_span(self, request: Prompt) -> AbstractContextManager[Span]:
        if self.tracer is None:
            return UNTRACED
        return self.tracer.turn(self.name, request.messages, request.context)

    def _request_span(self, request: ModelRequest) -> AbstractContextManager[Span]:
        if self.tracer is None:
            return UNTRACED
        return self.tracer.request(self.name, self.provider, request)

    def _tool_span(self, call: ToolCall) -> AbstractContextManager[Span]:
        if self.tracer is None:
            return UNTRACED
        return self.tracer.tool(self.name, call, self.tools.get(call.name))

    def _compaction_span(
        self, reason: str, state: State, parent: contextvars.Context | None = None, *, due: bool = True
    ) -> AbstractContextManager[Span]:
        """A span for a compaction; an automatic one only when a trigger is reached (not for
        every step's check)."""
        if self.tracer is None:
            return UNTRACED
        if not due:
            try:
                due = self.compactor.should_compact(state)
            except CmdcError:
                due = True  # the compaction will fail on it: the span shows that
            if not due:
                return UNTRACED
        return self.tracer.compaction(self.name, reason, state, parent)

    def _emit(self, kind: str, **data: Any) -> None:
        if self.bus.listening(self.name):
            self.bus.publish(Event(kind, self.name, data, trio.current_time()))


__all__ = [
    "Agent",
    "AgentOptions",
    "AgentRef",
    "LifecycleContext",
    "RequestContext",
    "ResponseContext",
    "RestartPolicy",
    "ToolContext",
]
