"""`cmdc compact` holds a file's messages once: their JSON is built while the journal is
written, a batch at a time, and let go (the text and the JSON of every message, both held to
the end, were 3.2x the file's size at peak)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from cmdc import Message, OffloadStore, State
from cmdc.cli import _chatfile, main
from cmdc.cli._chatfile import read_chat
from cmdc.compaction.clip import reduced
from cmdc.errors import ChatFileError
from cmdc.state import ENCODE_EAGERLY


def _messages(n: int) -> list[Message]:
    return [
        Message.user(f"question {i} " + "words " * 400) if i % 2 == 0 else Message.assistant(f"a{i}") for i in range(n)
    ]


def test_a_state_made_lazily_encodes_nothing_and_one_made_as_usual_everything() -> None:
    lazy_msgs, eager_msgs = _messages(4), _messages(4)
    token = ENCODE_EAGERLY.set(False)
    try:
        State(agent_id="a", messages=lazy_msgs)
    finally:
        ENCODE_EAGERLY.reset(token)
    assert all(m._json is None and m._json_crc is None for m in lazy_msgs)
    State(agent_id="a", messages=eager_msgs)
    assert all(m._json is not None and m._json_crc is not None for m in eager_msgs)


async def test_the_journal_lets_go_of_the_json_it_built_and_reads_back_the_same(tmp_path: Path) -> None:
    fresh = _messages(700)  # more than one batch of lines
    kept = _messages(3)
    for m in kept:
        m.json_crc()  # encoded when it entered a state: that JSON stays cached
    store = OffloadStore(tmp_path, index=False)
    await store.append("a", [*fresh, *kept], compaction=1)
    assert all(m._json is None and m._json_crc is None for m in fresh)
    assert all(m._json is not None for m in kept)
    back = [r.message for r in await store.records("a")]
    assert [m.to_json() for m in back] == [m.to_json() for m in [*fresh, *kept]]
    again = await store.append("a", fresh[:5], compaction=2)  # encoded again when asked for
    assert again.last_seq - again.first_seq == 4 and fresh[0].json_crc() == back[0].json_crc()


async def test_the_summarizers_media_check_caches_no_json(tmp_path: Path) -> None:
    msgs = _messages(10)
    written = await OffloadStore(tmp_path, index=False).append("a", msgs, compaction=1)
    assert all(m._json is None for m in msgs)
    reduced(msgs, None, written)
    assert all(m._json is None for m in msgs)


def test_compact_output_is_the_same_with_lazy_encoding(tmp_path: Path) -> None:
    chat = tmp_path / "chat.jsonl"
    rows = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "x y " * 300} for i in range(60)]
    chat.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    assert main(["compact", str(chat), "--out", str(tmp_path / "out.jsonl"), "--keep", "4"]) == 0
    out = [orjson.loads(line) for line in (tmp_path / "out.jsonl").read_bytes().splitlines()]
    assert [o["content"] for o in out[-4:]] == [r["content"] for r in rows[-4:]]
    journal = next((tmp_path / ".cmdc" / "conversation_history").glob("*.jsonl"))
    lines = [orjson.loads(line) for line in journal.read_bytes().splitlines() if b'"message"' in line]
    assert [o["message"]["content"] for o in lines] == [r["content"] for r in rows[1:-4]]  # the first: the pinned task


@pytest.mark.parametrize("shape", ["array", "envelope"])
def test_a_json_document_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    rows = [{"role": "user", "content": f"q{i}"} for i in range(5)]
    doc = orjson.dumps(rows if shape == "array" else {"model": "m", "messages": rows})
    path = tmp_path / "chat.json"
    path.write_bytes(doc)
    whole: list[int] = []
    real = orjson.loads

    def counting(data: bytes | str) -> Any:
        if len(data) == len(doc):
            whole.append(1)
        return real(data)

    monkeypatch.setattr(orjson, "loads", counting)
    chat = read_chat(path)
    assert [m.text for m in chat.messages] == [r["content"] for r in rows]
    # never two parsed copies; an array of objects is parsed an object at a time
    assert len(whole) == (0 if shape == "array" else 1)


@pytest.mark.parametrize(
    "doc",
    [
        b' [ {"role":"user","content":"}]{\\"["} ,\n'
        b'{"role":"assistant","content":"[{","metadata":{"a":[1,{"b":"]"}]}} ]\n',
        b'[{"role":"user","content":"a"},{"role":"user","content":"b"},]',  # a trailing comma
        b'[{"role":"user","content":"a"}{"role":"user","content":"b"}]',  # a missing comma
        b'[{"role":"user","content":"a"}, 3]',
        b'[{"role":"user","content":"a"}] x',
        b'[{"role":"nobody","content":"a"}, {"role":"user","content":"b\x01"}]',  # bad role, then bad JSON
        b'[{"role":"nobody","content":"a"}, {"role":"user","content":"b"}]',
        b'[{"role":"user","content":"a"}, {"role":"user","content":"\xff"}]',
        b"[" + b'{"role":"user","content":' * 600 + b'"x"' + b"}" * 600 + b"]",
    ],
)
def test_an_array_read_an_object_at_a_time_reads_as_when_parsed_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, doc: bytes
) -> None:
    path = tmp_path / "chat.json"
    path.write_bytes(doc)

    def outcome() -> tuple[str, ...]:
        try:
            return tuple(orjson.dumps({**m.to_dict(), "id": ""}).decode() for m in read_chat(path).messages)
        except ChatFileError as exc:
            return ("error", str(exc))

    streamed = outcome()
    monkeypatch.setattr(_chatfile, "_array_messages", lambda path, data: None)  # the whole-document reader
    assert streamed == outcome()
