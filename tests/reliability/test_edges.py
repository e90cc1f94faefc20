"""Rough edges (issue 26): options read on the class, small reduce limits, config validation,
offload directories and stores checked before any model call, the default trigger."""

from __future__ import annotations

import hashlib
import inspect
import os
import pydoc
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from benchmarks.compact_file import write_chat
from cmdc import Compactor, Message, OffloadStore, ToolCall, _fs, offload, open_runtime
from cmdc.cli import _stable_ids
from cmdc.cli._chatfile import read_chat
from cmdc.compaction import Compacted
from cmdc.errors import CheckpointError, OffloadError
from cmdc.providers import ExtractiveSummarizer
from cmdc.providers.base import ModelRequest
from cmdc.testing import RecordingSummarizer
from cmdc.tokens import estimate_message_tokens
from tests._support.fakes import make_state, res

SECTIONS = "## All user messages\n- (filled by cmdc)\n## Current work\nediting"


def test_the_options_are_documented_on_the_class() -> None:
    # was: reading a descriptor on the class raised AttributeError; the options are now only
    # CompactorOptions' fields, shown as Compactor's parameters (help(), inspect)
    assert "retries" in inspect.signature(Compactor).parameters
    assert "retries" in pydoc.render_doc(Compactor)
    c = Compactor(RecordingSummarizer(SECTIONS), retries=2)
    assert c.options.retries == 2 and c.retries == 2  # type: ignore[attr-defined]


async def test_a_small_reduce_limit_clips_small_tool_arguments_and_results(tmp_path: Path) -> None:
    body = "q" * 200  # about 50 tokens: below the media pre-check's floor
    msgs = [
        Message.user("u"),
        Message.assistant("", tool_calls=(ToolCall(id="w", name="write_file", arguments={"body": body}),)),
        res("w", "r" * 200),
        Message.user("next"),
        Message.assistant("done"),
    ]
    summarizer = RecordingSummarizer(SECTIONS)
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


# -- item 1: an unusable offload directory or store fails at open_runtime / spawn --------------


class Counting:
    """A provider that counts its requests (none may be made before the check)."""

    context_window = None

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: object) -> Message:
        self.calls += 1
        return Message.assistant("done")


def _blocked(tmp_path: Path) -> Path:
    """A directory path that cannot be made, even by root: its parent is a regular file."""
    (tmp_path / "a-file").write_text("x")
    return tmp_path / "a-file" / "journals"


async def test_spawn_refuses_an_unusable_offload_directory_before_any_model_request(tmp_path: Path) -> None:
    bad = _blocked(tmp_path)
    provider = Counting()
    async with open_runtime(log_events=False) as rt:
        with pytest.raises(
            OffloadError, match=rf"offload directory {re.escape(str(bad))} is not usable: Not a directory"
        ):
            await rt.spawn("a1", provider, config={"compact_offload_dir": str(bad)})
        assert rt.whereis("a1") is None
        good = await rt.spawn("a2", provider, config={"compact_offload_dir": str(tmp_path / "ok")})
        assert (await good.prompt("hi")).text == "done"
    assert provider.calls == 1  # only the good agent's
    assert [p.name for p in (tmp_path / "ok").iterdir()] == []  # the probe file is removed


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs sysfs")
async def test_spawn_refuses_sysfs(tmp_path: Path) -> None:
    async with open_runtime(log_events=False) as rt:
        with pytest.raises(OffloadError, match="/sys/kernel/cmdc is not usable"):
            await rt.spawn("a1", Counting(), config={"compact_offload_dir": "/sys/kernel/cmdc"})


async def test_open_runtime_refuses_an_unusable_store_or_checkpoint_directory(tmp_path: Path) -> None:
    bad = _blocked(tmp_path)
    with pytest.raises(OffloadError, match=rf"{re.escape(str(bad))} is not usable"):
        async with open_runtime(store=bad, log_events=False):
            pytest.fail("the runtime opened")
    with pytest.raises(CheckpointError, match=rf"checkpoint directory {re.escape(str(bad))} is not usable"):
        async with open_runtime(checkpoint_dir=bad, log_events=False):
            pytest.fail("the runtime opened")


async def test_a_directory_is_probed_once_for_many_agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probes: list[Path] = []
    real = _fs.probe_dir

    def counting(directory: Path) -> None:
        probes.append(directory)
        real(directory)

    monkeypatch.setattr(_fs, "probe_dir", counting)
    config = {"compact_offload_dir": str(tmp_path / "shared")}
    async with open_runtime(log_events=False) as rt:
        for i in range(30):
            await rt.spawn(f"a{i}", Counting(), config=config)
    assert probes == [tmp_path / "shared"]
    async with open_runtime(store=tmp_path / "store", log_events=False) as rt:
        for i in range(30):
            await rt.spawn(f"b{i}", Counting(), config=config)  # the store wins over the config's directory
    assert probes == [tmp_path / "shared", tmp_path / "store"]


# -- item 5: the default trigger is a fraction of a declared window ---------------------------


class Sizes:
    """Answers briefly; records each request's size (cmdc's estimate of its messages)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    async def complete(self, request: ModelRequest) -> Message:
        self.sizes.append(sum(estimate_message_tokens(m) for m in request.messages))
        return Message.assistant("noted")


async def test_a_declared_window_without_a_trigger_compacts_before_the_window(tmp_path: Path) -> None:
    window = 4_000
    provider = Sizes()
    config = {"context_window": window, "compact_offload_dir": str(tmp_path)}
    async with open_runtime(log_events=False) as rt:
        agent = await rt.spawn("a1", provider, config=config, summarizer=ExtractiveSummarizer())
        for i in range(20):
            await agent.prompt(f"step {i}: " + "lorem ipsum dolor " * 100)  # about 450 tokens each
        state = await agent.state()
    assert state.compactions >= 2
    assert max(provider.sizes) < window  # before: the trigger stayed at 170,000, far past the window
    assert max(provider.sizes) > 0.6 * window  # and it was not compacting at every turn


# -- item 7: `cmdc compact` on a large file: memory ---------------------------------------------


ROOT = str(Path(__file__).resolve().parents[2])


def measured_alone(script: str, *args: str) -> list[int]:
    """The numbers `script` prints, run in a process of its own: tracemalloc counts every
    thread's allocations, and earlier tests leave threads working in the background (each
    store's journal indexer, `cmdc-index`, indexes a while after the store's last append)."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [int(n) for n in done.stdout.split()]


JSON_KEPT = """
import tracemalloc
from cmdc import Message

messages = [Message.tool_result(f"c{i}", "word " * 200) for i in range(500)]
tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
encoded = [m.to_json() for m in messages]
kept = tracemalloc.get_traced_memory()[0] - before
tracemalloc.stop()
print(kept, sum(len(e) for e in encoded))
"""


def test_a_cached_message_json_takes_its_own_size() -> None:
    """orjson's result keeps the buffer it wrote into (4 KB and up, ~8x a 1 KB message): the
    JSON a message keeps is copied to its own size."""
    kept, size = measured_alone(JSON_KEPT)
    assert kept < 1.5 * size  # before: about 8x


READ_CHAT_PEAK = """
import sys, tracemalloc
from pathlib import Path
from cmdc.cli._chatfile import read_chat

tracemalloc.start()
chat = read_chat(Path(sys.argv[1]))
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(peak, sum(len(m.text) for m in chat.messages))
"""


def test_a_jsonl_file_is_read_a_line_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    write_chat(path, 4_000_000)
    peak, live = measured_alone(READ_CHAT_PEAK, str(path))
    # before: the whole file, then every line again, then the messages (about 3.4x the file)
    assert peak < 2 * path.stat().st_size and live > 0.8 * path.stat().st_size


def test_stable_ids_are_the_documented_digest(tmp_path: Path) -> None:
    """`_stable_ids` (made faster) gives the ids it always gave: a re-compacted file journals nothing twice."""
    path = tmp_path / "chat.jsonl"
    write_chat(path, 200_000)
    chat = read_chat(path)
    digest, expected = b"", []
    for m in chat.messages:
        data = m.to_dict()
        data.pop("id")
        digest = hashlib.sha256(digest + orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).digest()
        expected.append(m.evolve(id="f" + digest[:12].hex()))
    got = _stable_ids(chat.messages)
    assert list(got) == expected and [m.to_json() for m in got] == [m.to_json() for m in expected]


async def test_committing_a_large_attempt_does_not_copy_what_the_writer_remembers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offload, "_KNOWN", 100)  # past it, a commit prunes what it may forget
    store = OffloadStore(tmp_path)
    first = [Message.user(f"m{i}") for i in range(300)]
    written = await store.append("a1", first, compaction=1, attempt=offload.new_attempt_id(), commit=False)
    known = store._journals["a1"].known
    assert await store.commit("a1", [written.attempt])
    assert store._journals["a1"].known is known  # every record kept: nothing to copy (was a full rebuild)
    second = [Message.user(f"n{i}") for i in range(300)]
    again = await store.append("a1", second, compaction=2, attempt=offload.new_attempt_id(), commit=False)
    assert await store.commit("a1", [again.attempt])
    pruned = store._journals["a1"].known
    assert pruned is not known and len(pruned) == 300  # the first attempt's records forgotten
    assert [m.text for m in await store.read("a1")] == [m.text for m in first + second]
