"""Delegation: an agent hands a task to a temporary child or to another agent by name, within the depth bound."""

from __future__ import annotations

import re
from pathlib import Path

from fakes import Adder, add, agent_config

from cmdc import (
    Message,
    ProviderError,
    ToolCall,
    open_runtime,
)
from cmdc.agent import current_chain
from cmdc.providers import ModelRequest, ScriptedProvider


async def test_delegation(tmp_path: Path) -> None:
    async def parent_model(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if last.role == "user":
            call = ToolCall(id="d1", name="delegate", arguments={"task": "what is 20 + 22?"})
            return Message.assistant("", tool_calls=(call,))
        return Message.assistant(f"my helper says: {last.text} (error={last.is_error})")

    class Family(Adder):
        """The parent plans; its temporary children (same provider) do arithmetic."""

        child_fails = False

        async def complete(self, request: ModelRequest) -> Message:
            if current_chain.get()[-1] == "parent":
                return await parent_model(request)
            if self.child_fails:
                raise ProviderError("child model down")
            return await super().complete(request)

    model = Family()
    async with open_runtime(log_events=False) as rt:
        parent = await rt.spawn("parent", model, tools=[add], config=agent_config(tmp_path), delegation=True)
        reply = await parent.prompt("please delegate")
        assert reply.text == "my helper says: answer: 42 (error=False)"
        assert rt.agents == ["parent"]  # the temporary child is gone
        # a child that fails gives the parent an error result, not a crash
        model.child_fails = True
        reply = await parent.prompt("please delegate")
        assert "error=True" in reply.text and "child model down" in reply.text
        assert parent.running and rt.agents == ["parent"]


async def test_delegation_by_name_and_depth(tmp_path: Path) -> None:
    async def chain_model(request: ModelRequest) -> Message:
        last = request.messages[-1]
        me = current_chain.get()[-1]
        if last.role == "user":
            target = {"a": "b", "b": "a"}[me]
            call = ToolCall(id=f"x-{me}", name="delegate", arguments={"task": "hi", "agent": target})
            return Message.assistant("", tool_calls=(call,))
        return Message.assistant(f"{me} got: {last.text}")

    async with open_runtime(log_events=False) as rt:
        a = await rt.spawn(
            "a",
            ScriptedProvider([chain_model], cycle=True),
            config=agent_config(tmp_path),
            delegation=["b"],
            accepts=["b"],
        )
        await rt.spawn(
            "b",
            ScriptedProvider([chain_model], cycle=True),
            config=agent_config(tmp_path),
            delegation=["a"],
            accepts=["a"],
        )
        reply = await a.prompt("start")
        # a -> b -> a would wait on itself: b gets an error result and answers with it
        assert reply.text.startswith("a got: b got: ") and "already waiting" in reply.text


async def test_temporary_children_names_never_repeat_across_runtimes(tmp_path: Path) -> None:
    """The child counter restarts in every runtime (a later process, another cluster node): a
    random token per runtime in the name keeps a new child off an earlier child's journal."""
    seen: list[str] = []

    async def model(request: ModelRequest) -> Message:
        me = current_chain.get()[-1]
        last = request.messages[-1]
        if me != "parent":
            seen.append(me)
            return Message.assistant("done")
        if last.role == "user":
            return Message.assistant("", tool_calls=(ToolCall(id="d", name="delegate", arguments={"task": "t"}),))
        return Message.assistant(last.text)

    for _ in range(2):  # the same parent, resumed from the same store, in two runtimes
        async with open_runtime(store=str(tmp_path / "store"), log_events=False) as rt:
            parent = await rt.spawn("parent", ScriptedProvider([model], cycle=True), delegation=True, resume=True)
            for _ in range(2):
                assert (await parent.prompt("go")).text == "done"
    assert len(seen) == 4 and len(set(seen)) == 4, seen
    assert all(re.fullmatch(r"parent\.child[12]-[0-9a-f]{12}", n) for n in seen), seen
    assert seen[0].split("-")[1] == seen[1].split("-")[1] != seen[2].split("-")[1]  # one token per runtime
