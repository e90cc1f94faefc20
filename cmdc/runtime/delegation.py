"""Agents working with agents: who may hand a task to whom (`Grants`), the built-in `delegate`
tool, temporary children, and the wait-for graph that refuses a delegation which would deadlock."""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs

from .._frozen import thaw
from ..errors import AgentStopped, ConfigError, DelegationRefused
from ..tools import Tool, tool
from .mailbox import current_chain

if TYPE_CHECKING:
    from .agent import Agent
    from .ref import AgentRef
    from .runtime import Runtime
    from .virtual import Slot

Grant = bool | str | Iterable[str]
"""Who an agent may delegate to, or accept delegated tasks from: False (nobody), True (anyone
allowed by the other side), or agent names and `fnmatch` patterns (`"worker-*"`)."""


def patterns(what: str, value: object) -> tuple[str, ...] | None:
    """None for False; ("*",) for True; the patterns of a name, pattern or list of them."""
    if value is False or value is None:
        return None
    if value is True:
        return ("*",)
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, Iterable):
        raise ConfigError(f"{what} must be a bool, an agent name or pattern, or a list of them, got {value!r:.80}")
    out = tuple(names)
    for p in out:
        if not isinstance(p, str) or not p or len(p) > 256:
            raise ConfigError(f"{what}: every entry must be an agent name or pattern (a string), got {p!r:.80}")
    return out


def matches(name: str, patterns: tuple[str, ...] | None) -> bool:
    return patterns is not None and any(fnmatch.fnmatchcase(name, p) for p in patterns)


@attrs.frozen
class Grants:
    """Who an agent may reach with `delegate` (`children`: temporary children of its own;
    `targets`: running agents by name or pattern), and whose delegated tasks it accepts."""

    children: bool
    targets: tuple[str, ...] | None
    accepts: tuple[str, ...] | None


NO_GRANTS = Grants(children=False, targets=None, accepts=None)


class Delegation:
    """The runtime's side of delegation (a part of `Runtime`, whose `run_child` spawns a
    temporary child): children's names and count, the grants check, the wait-for graph."""

    _slots: dict[str, Slot]
    _children: itertools.count[int]
    _child_token: str
    _live_children: dict[str, int]  # agent -> its temporary children running now
    _waits: dict[str, list[str]]  # the wait-for graph: agent -> agents it waits on

    if TYPE_CHECKING:

        def observe(self, name: str) -> Agent | None: ...

        def whereis(self, name: str) -> AgentRef | None: ...

    def child_name(self, parent: str) -> str:
        """A name for a new temporary child of `parent`: `parent.childN-TOKEN`, where TOKEN is
        random per runtime (48 bits): another runtime (a later process, another cluster node, the
        same parent activated again elsewhere) never hands out the same name, so a child never
        appends to an earlier child's journal."""
        return f"{parent[:96]}.child{next(self._children)}-{self._child_token}"

    # -- who may talk to whom ----------------------------------------------------------------
    def check_delegation(self, sender: str, target: str) -> AgentRef:
        """The running agent `target`, if `sender` may hand it a task: `sender` was granted
        it (by name or pattern) and `target` accepts tasks from `sender`. Otherwise
        `DelegationRefused`, saying which side refused."""
        slot = self._slots.get(sender)
        mine = None if slot is None else slot.grants
        if mine is None or not matches(target, mine.targets):
            allowed = ", ".join(mine.targets) if mine is not None and mine.targets else "none"
            raise DelegationRefused(
                f"agent {sender!r} may not delegate to {target!r}: it may delegate to its own temporary "
                f"children (leave out 'agent') and to these agents: {allowed}"
            )
        ref = self.whereis(target)
        slot = self._slots.get(target)
        theirs = None if slot is None else slot.grants
        if ref is None or theirs is None:
            raise DelegationRefused(f"no running agent is called {target!r}")
        if not matches(sender, theirs.accepts):
            raise DelegationRefused(f"agent {target!r} does not accept delegated tasks from {sender!r}")
        return ref

    def wait_path(self, start: str, goal: str) -> list[str] | None:
        """A path start -> ... -> goal in the wait-for graph (each agent waits on the next),
        or None."""
        if start == goal:
            return [start]
        parents: dict[str, str] = {start: start}
        frontier = [start]
        while frontier:
            node = frontier.pop()
            for nxt in self._waits.get(node, ()):
                if nxt in parents:
                    continue
                parents[nxt] = node
                if nxt == goal:
                    path = [goal]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return path[::-1]
                frontier.append(nxt)
        return None

    @contextmanager
    def waiting(self, waiter: str, target: str) -> Iterator[None]:
        """Record that `waiter` waits on `target` for as long as the block runs; refuse with
        `DelegationRefused` if `target` already waits (directly or through others) on
        `waiter`: the two would wait on each other for ever."""
        path = self.wait_path(target, waiter)
        if path is not None:
            cycle = " -> ".join([waiter, *path])
            raise DelegationRefused(
                f"delegation refused: {target!r} is already waiting on {waiter!r} ({cycle}); "
                "handing it this task would deadlock both. Do the task yourself or answer without it."
            )
        edges = self._waits.setdefault(waiter, [])
        edges.append(target)
        try:
            yield
        finally:
            edges.remove(target)
            if not edges:
                del self._waits[waiter]

    @contextmanager
    def child_slot(self, parent: str, limit: int) -> Iterator[None]:
        """Count a temporary child of `parent` while the block runs; `DelegationRefused` past `limit`."""
        live = self._live_children.get(parent, 0)
        if live >= limit:
            raise DelegationRefused(
                f"agent {parent!r} already has {live} temporary children at work (max_children={limit}); "
                "wait for their answers, then delegate again, or do this task yourself"
            )
        self._live_children[parent] = live + 1
        try:
            yield
        finally:
            left = self._live_children[parent] - 1
            if left:
                self._live_children[parent] = left
            else:
                del self._live_children[parent]


def delegate_tool(runtime: Runtime, parent: str, targets: tuple[str, ...] | None = None) -> Tool:
    async def delegate(task: str, agent: str | None = None) -> str:
        """Hand a task to another agent and return its final answer.

        Args:
            task: What the other agent should do, with everything it needs to know.
            agent: The name of a running agent you were allowed to delegate to; leave it out to have
                a temporary child agent do it.
        """
        chain = current_chain.get()
        me = runtime.observe(parent)
        if me is None:
            raise AgentStopped(f"agent {parent!r} is not running")
        depth = me.options.max_delegation_depth
        if len(chain) >= depth:
            raise DelegationRefused(f"delegation depth limit ({depth}) reached: {' -> '.join(chain)}")
        if agent is not None:
            target = runtime.check_delegation(parent, agent)
            with runtime.waiting(parent, agent):
                return (await target.prompt(task)).text
        return await runtime.run_child(parent, task)

    return naming_targets(tool(delegate, name="delegate"), targets)


def naming_targets(delegate: Tool, targets: tuple[str, ...] | None) -> Tool:
    """`delegate` with the agents it may reach named in its `agent` parameter (the model has no
    other way to know them): listed in the description, and as the parameter's `enum` when they
    are all plain names (not patterns)."""
    if not targets:
        return delegate
    parameters = thaw(delegate.parameters)
    agent = parameters["properties"]["agent"]
    agent["description"] = f"{agent.get('description', '')} You may delegate to: {', '.join(targets)}.".strip()
    if not any(c in t for t in targets for c in "*?["):
        agent["enum"] = [*targets, None]
    return attrs.evolve(delegate, parameters=parameters)


__all__ = ["NO_GRANTS", "Delegation", "Grant", "Grants", "delegate_tool", "matches", "naming_targets", "patterns"]
