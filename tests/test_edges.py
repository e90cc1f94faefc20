"""Rough edges (issue 26): options read on the class, small reduce limits, config validation,
offload directories and stores checked before any model call, the default trigger."""

from __future__ import annotations

from pathlib import Path

from fakes import Recorder, make_state, res

from cmdc import Compactor, Message, OffloadStore, ToolCall
from cmdc.compaction import Compacted

SECTIONS = "## All user messages\n- (filled by cmdc)\n## Current work\nediting"


def test_an_option_read_on_the_class_is_its_descriptor() -> None:
    option = Compactor.retries  # was: AttributeError 'NoneType' object has no attribute 'options'
    assert "retries" in repr(option)
    assert Compactor(Recorder(SECTIONS), retries=2).retries == 2


async def test_a_small_reduce_limit_clips_small_tool_arguments_and_results(tmp_path: Path) -> None:
    body = "q" * 200  # about 50 tokens: below the media pre-check's floor
    msgs = [
        Message.user("u"),
        Message.assistant("", tool_calls=(ToolCall(id="w", name="write_file", arguments={"body": body}),)),
        res("w", "r" * 200),
        Message.user("next"),
        Message.assistant("done"),
    ]
    summarizer = Recorder(SECTIONS)
    result = await Compactor(summarizer, reduce_tokens=10).force_compact(
        make_state(tmp_path, msgs, compact_keep=("messages", 1))
    )
    assert isinstance(result, Compacted)
    seen = {m.id: m for m in summarizer.calls[0][0]}
    argument = seen[msgs[1].id].tool_calls[0].arguments["body"]
    # cut to the limit (10 tokens, 40 bytes: too few for the marker, so the bare head)
    assert body.startswith(argument) and len(argument) <= 40
    assert len(seen[msgs[2].id].text) <= 40
    journal = {m.id: m for m in await OffloadStore(tmp_path).read("a1")}  # whole there
    assert journal[msgs[1].id].tool_calls[0].arguments["body"] == body and journal[msgs[2].id].text == "r" * 200
