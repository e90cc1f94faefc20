"""Conversation files of OpenAI-style chat messages, for `cmdc compact`.

A file is either JSONL (one message object per line; blank lines are skipped), a JSON array
of message objects, or a JSON object holding that array under `"messages"` (a request body; its
other keys are written back unchanged). A UTF-8 byte order mark is skipped. Each message is
checked and converted to a cmdc `Message` before anything is written; the first problem raises
`ChatFileError` naming the file, the line (JSONL, 1-based) or the element (array, 0-based `[i]`)
and what is wrong.

Accepted, per message: `role` (`system`, `developer` — kept as a system message — `user`,
`assistant`, `tool`); `content` as a string or a list of parts (`{"type": "text", "text"}`,
`{"type": "image_url", "image_url": {"url"}}` for user messages); on assistant messages
`tool_calls` (`{"id", "type": "function", "function": {"name", "arguments"}}`, `arguments` a JSON
object encoded as a string; `""` counts as `{}`), `content` may then be null; on tool results
`tool_call_id`, which must name a call of an earlier assistant message that has no result yet.
`name` and other keys are carried along. An optional `"cmdc"` object is cmdc's own metadata
(`{"pinned": true}` pins a message; the summary written by `--annotate` has `"kind": "summary"`);
a user message starting with `[Conversation summary #N]` (a summary cmdc wrote) is read back as a
summary, so compacting a compacted file folds the old summary in instead of quoting it, and the
user messages its "All user messages" section carries are carried on (with or without
`--annotate`).

Messages that a plain conversion would not reproduce exactly keep their original object in
their metadata (`openai.message`), so the journal loses nothing and the compacted file repeats
kept messages exactly as they were.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Literal

import attrs
import orjson

from .._frozen import thaw
from ..compaction.finalize import USER_MESSAGES_HEADING, USER_MESSAGES_KEY
from ..errors import ChatFileError, InvalidMessage
from ..message import KIND_KEY, PINNED_KEY, SUMMARY_KIND, ImagePart, Message, Part, TextPart, ToolCall
from ..store.fs import atomic_write

Format = Literal["jsonl", "json"]

SOURCE_KEY = "openai.message"
"""Metadata key holding a message's original object when converting it back would differ."""

ROLE_KEY = "openai.role"
"""Metadata key holding the original role when it is not a cmdc role (`developer`)."""

_ROLES = ("system", "developer", "user", "assistant", "tool")
_SUMMARY_HEAD = re.compile(r"\[Conversation summary #(\d+)\]")
_HEADING = re.compile(r"^#{1,6}\s*(?:\d+[.)]\s*)?(.+?)\s*:?\s*$")
_BOM = b"\xef\xbb\xbf"
_SPACE = re.compile(rb"\s*")
_CMDC_PREFIX = "cmdc."


@attrs.frozen
class ChatFile:
    """A parsed conversation: its format and the converted messages, in order."""

    path: Path
    format: Format
    messages: tuple[Message, ...]
    envelope: Mapping[str, Any] | None = None
    """For a JSON object holding the messages under `"messages"`: its other keys."""


class _Problem(Exception):
    """A problem in one message; the reader adds where it is."""


# -- reading ----------------------------------------------------------------------------------


def detect_format(path: Path, data: bytes) -> Format:
    """JSONL for `.jsonl`/`.ndjson` files, a JSON array for `.json`, else by the first character."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".json":
        return "json"
    return "json" if _first_byte(data) == b"[" else "jsonl"


MAX_CHAT_BYTES = 1 << 30
"""The largest conversation read (1 GiB): a file or standard input past it is refused."""

STDIN = Path("<stdin>")
"""The name standard input goes by in messages."""


def read_chat(path: Path, data: bytes | None = None) -> ChatFile:
    """Read, check and convert a conversation file; raise `ChatFileError` on the first problem.
    `data`: the conversation's bytes, already read (standard input), named `path` in messages.
    Only regular files are read (a FIFO would block, `/dev/zero` never ends), at most
    `MAX_CHAT_BYTES`; JSONL is read a line at a time (the file is never held whole)."""
    if data is not None:
        box = [data]
        del data
        return _parse(path, box)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO opens at once
    except FileNotFoundError:
        raise ChatFileError(path, "no such file") from None
    except OSError as exc:
        raise ChatFileError(path, f"cannot read it: {os.strerror(exc.errno) if exc.errno else exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # checked before fdopen, which refuses a directory with a bare errno
        os.close(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ChatFileError(path, "is a directory, not a conversation file")
        raise ChatFileError(path, f"is {_file_kind(info.st_mode)}, not a regular file (use - for standard input)")
    with os.fdopen(fd, "rb") as f:
        if info.st_size > MAX_CHAT_BYTES:
            raise ChatFileError(path, f"is {info.st_size:,} bytes, more than the {MAX_CHAT_BYTES:,} read")
        try:
            streamed = _stream_jsonl(path, f)
            if streamed is not None:
                return streamed
            f.seek(0)
            data = f.read(MAX_CHAT_BYTES + 1)
        except OSError as exc:
            raise ChatFileError(path, f"cannot read it: {os.strerror(exc.errno) if exc.errno else exc}") from None
    if len(data) > MAX_CHAT_BYTES:
        raise ChatFileError(path, f"grew past the {MAX_CHAT_BYTES:,} bytes read")
    box = [data]
    del data
    return _parse(path, box)


def read_stream(stream: BinaryIO, name: Path = STDIN) -> bytes:
    """All of `stream` (standard input), at most `MAX_CHAT_BYTES`, else `ChatFileError`."""
    chunks: list[bytes] = []
    size = 0
    while chunk := stream.read(1 << 20):
        size += len(chunk)
        if size > MAX_CHAT_BYTES:
            raise ChatFileError(name, f"more than the {MAX_CHAT_BYTES:,} bytes read")
        chunks.append(chunk)
    return b"".join(chunks)


def _file_kind(mode: int) -> str:
    kinds = [(stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]
    kinds.append((stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _stream_jsonl(path: Path, f: BinaryIO) -> ChatFile | None:
    """A JSONL file read line by line; None when the file is not plainly JSONL (by its suffix
    or first character a JSON document, its first line not one message, or one line holding
    a request body): then it is read whole."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        return None
    converter = _Converter()
    messages: list[Message] = []
    first = True
    for number, line in enumerate(f, 1):
        if first:
            line = line.removeprefix(_BOM)
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if first:
                return None  # a JSON document over several lines, or not JSON at all
            raise ChatFileError(path, f"not valid JSON ({_json_problem(exc)})", line=number) from None
        if first and (not isinstance(obj, dict) or ("role" not in obj and "messages" in obj)):
            return None  # an array, or a request body: read whole
        first = False
        try:
            messages.append(converter.convert(obj))
        except _Problem as exc:
            raise ChatFileError(path, str(exc), line=number) from None
    if first:
        return None  # blank: said by the whole-file reader
    return ChatFile(path=path, format="jsonl", messages=tuple(messages))


def _first_byte(data: bytes) -> bytes:
    """The first byte that is not whitespace (b"" if none), without copying `data`."""
    start = _SPACE.match(data)
    at = 0 if start is None else start.end()
    return data[at : at + 1]


def _lines(data: bytes) -> Iterator[bytes]:
    """`data.split(b"\\n")`, one line at a time (not every line at once beside `data`)."""
    start = 0
    while start <= len(data):
        end = data.find(b"\n", start)
        if end < 0:
            end = len(data)
        yield data[start:end]
        start = end + 1


def _parse(path: Path, box: list[bytes]) -> ChatFile:
    """The conversation in `box`'s one item, taken out of it: the caller holds no other
    reference, so the bytes are freed as soon as a JSON document is parsed."""
    data = box.pop().removeprefix(_BOM)
    first = _first_byte(data)
    if not first:
        raise ChatFileError(path, "the file is empty: it holds no messages")
    fmt = detect_format(path, data)
    whole: Any = None  # the document, parsed once (a JSON array, or an object: an envelope?)
    problem: orjson.JSONDecodeError | None = None
    if fmt == "json" and first == b"[":
        streamed = _array_messages(path, data)
        if streamed is not None:
            return ChatFile(path=path, format="json", messages=streamed)
    if fmt == "json" or first == b"{":
        try:
            whole = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            problem = exc
    envelope = _envelope(path, whole)
    if envelope is not None or fmt == "json":
        del data  # parsed: the objects replace the bytes
    if envelope is not None:
        fmt = "json"
    if fmt != "json" or envelope is not None:
        whole = None
    converter = _Converter()
    messages: list[Message] = []
    if envelope is not None:
        for index, obj in enumerate(envelope[0]):
            try:
                messages.append(converter.convert(obj))
            except _Problem as exc:
                raise ChatFileError(path, f"messages[{index}]: {exc}") from None
    elif fmt == "jsonl":
        for number, line in enumerate(_lines(data), 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ChatFileError(path, f"not valid JSON ({_json_problem(exc)})", line=number) from None
            try:
                messages.append(converter.convert(obj))
            except _Problem as exc:
                raise ChatFileError(path, str(exc), line=number) from None
    else:
        if problem is not None:
            raise ChatFileError(path, f"not valid JSON ({_json_problem(problem, with_line=True)})") from None
        items, whole = whole, None
        if not isinstance(items, list):
            raise ChatFileError(
                path,
                f'expected a JSON array of messages, an object with a "messages" array, or JSONL (one message '
                f"per line), got {_kind(items)}",
            )
        for index in range(len(items)):
            obj, items[index] = items[index], None  # each object freed once converted
            try:
                messages.append(converter.convert(obj))
            except _Problem as exc:
                raise ChatFileError(path, str(exc), index=index) from None
    if not messages:
        raise ChatFileError(path, "holds no messages")
    return ChatFile(path=path, format=fmt, messages=tuple(messages), envelope=None if envelope is None else envelope[1])


_ARRAY_TOKEN = re.compile(rb'"[^"\\]*+(?:\\[\s\S][^"\\]*+)*+"|[\[\]{}]')  # a string, or a bracket
_GAP = re.compile(rb"[ \t\r\n]*")
_COMMA = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*")
_DEEP = 512  # nesting past which the whole document is parsed at once (as orjson limits it)


def _array_spans(data: bytes) -> list[tuple[int, int]] | None:
    """Where each object of a JSON array of objects starts and ends in `data`, found by its
    strings and brackets (each object is checked when parsed); None for anything else (an
    element not an object, a gap holding more than a comma, deep nesting, bytes after it)."""
    spans: list[tuple[int, int]] = []
    depth, begin, end = 0, 0, -1
    for m in _ARRAY_TOKEN.finditer(data):
        c = data[m.start()]
        if c == 0x22:  # a string: inside an object (the array holds objects only)
            if depth < 2:
                return None
            continue
        if c in (0x7B, 0x5B):  # { [
            if depth == 0 and (c != 0x5B or data[: m.start()].strip(b" \t\r\n")):
                return None
            if depth == 1:
                if c != 0x7B:
                    return None
                gap = _GAP if not spans else _COMMA
                if not gap.fullmatch(data, spans[-1][1] if spans else end + 1, m.start()):
                    return None
                begin = m.start()
            depth += 1
            if depth > _DEEP:
                return None
            if depth == 1:
                end = m.start()  # the array's opening bracket
        else:  # } ]
            depth -= 1
            if depth == 1:
                if c != 0x7D:
                    return None
                spans.append((begin, m.end()))
            elif depth == 0:
                if c != 0x5D:
                    return None
                if not _GAP.fullmatch(data, spans[-1][1] if spans else end + 1, m.start()):
                    return None
                return spans if not data[m.end() :].strip(b" \t\r\n") else None
    return None


def _array_messages(path: Path, data: bytes) -> tuple[Message, ...] | None:
    """The messages of a JSON array of objects, parsed an object at a time (the whole
    document's objects and the bytes are never held together); None when it is not plainly
    such an array or any object is not valid JSON: then the whole document is parsed (and
    its errors are said as for a whole document)."""
    spans = _array_spans(data)
    if not spans:
        return None
    converter = _Converter()
    messages: list[Message] = []
    for index, (start, stop) in enumerate(spans):
        try:
            obj = orjson.loads(data[start:stop])
        except orjson.JSONDecodeError:
            return None
        try:
            messages.append(converter.convert(obj))
        except _Problem as exc:
            try:  # a document not valid JSON further on is said as that first, as when parsed whole
                orjson.loads(data)
            except orjson.JSONDecodeError:
                return None
            raise ChatFileError(path, str(exc), index=index) from None
    return tuple(messages)


def _envelope(path: Path, obj: Any) -> tuple[list[Any], dict[str, Any]] | None:
    """`(messages, other keys)` when `obj` (a parsed document) is one JSON object holding a
    `"messages"` array; None when it is something else (an array, a single message, None)."""
    if not isinstance(obj, dict) or "role" in obj or "messages" not in obj:
        return None
    items = obj.pop("messages")
    if not isinstance(items, list):
        raise ChatFileError(path, f'"messages" must be an array of messages, got {_kind(items)}')
    return items, obj


def _json_problem(exc: orjson.JSONDecodeError, *, with_line: bool = False) -> str:
    if with_line:
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return f"{exc.msg} at column {exc.colno}"


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__  # pragma: no cover - JSON has no other types


class _Converter:
    """Converts messages in order, tracking tool calls that still wait for their result."""

    def __init__(self) -> None:
        self.waiting: dict[str, str] = {}  # call id -> tool name, calls without a result yet
        self.answered: set[str] = set()

    def convert(self, obj: object) -> Message:
        if not isinstance(obj, dict):
            raise _Problem(f"a message must be a JSON object, got {_kind(obj)}")
        role = obj.get("role")
        if "role" not in obj:
            raise _Problem('the message has no "role"')
        if role not in _ROLES:
            raise _Problem(f"unknown role {role!r} (expected one of {', '.join(_ROLES)})")
        metadata = _cmdc_metadata(obj.get("cmdc"))
        try:
            message = self._convert(obj, role, metadata)
        except InvalidMessage as exc:
            raise _Problem(str(exc)) from None
        if to_openai(message) != obj:  # keep what a plain conversion would lose
            message = message.evolve(metadata={**message.metadata, SOURCE_KEY: obj})
        return message

    def _convert(self, obj: dict[str, Any], role: str, metadata: dict[str, Any]) -> Message:
        if role in ("system", "developer"):
            if role == "developer":
                metadata[ROLE_KEY] = "developer"
            return Message.system(_content(obj, role, images=False), metadata=metadata)
        if role == "user":
            user_content = _content(obj, role, images=True)
            head = _SUMMARY_HEAD.match(user_content) if isinstance(user_content, str) else None
            if head and KIND_KEY not in metadata:
                metadata[KIND_KEY] = SUMMARY_KIND
                metadata.setdefault("cmdc.compaction", int(head[1]))
            if head and USER_MESSAGES_KEY not in metadata and isinstance(user_content, str):
                metadata[USER_MESSAGES_KEY] = carried_user_messages(user_content)
            return Message.user(user_content, metadata=metadata)
        if role == "assistant":
            calls = self._tool_calls(obj.get("tool_calls"))
            if obj.get("content") is None:
                if not calls:
                    raise _Problem('an assistant message needs "content" or "tool_calls"')
                content: str | tuple[Part, ...] = ""
            else:
                content = _content(obj, role, images=False)
            return Message.assistant(content, tool_calls=calls, metadata=metadata)
        # a tool result
        call_id = obj.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise _Problem('a tool result needs a "tool_call_id" string')
        if call_id in self.answered:
            raise _Problem(f"tool_call_id {call_id!r}: that call already has a result")
        if call_id not in self.waiting:
            raise _Problem(f"tool_call_id {call_id!r} matches no tool call of an earlier assistant message")
        del self.waiting[call_id]
        self.answered.add(call_id)
        return Message.tool_result(call_id, _content(obj, role, images=False), metadata=metadata)

    def _tool_calls(self, value: object) -> list[ToolCall]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise _Problem(f'"tool_calls" must be an array, got {_kind(value)}')
        calls: list[ToolCall] = []
        for i, call in enumerate(value):
            where = f"tool_calls[{i}]"
            if not isinstance(call, dict):
                raise _Problem(f"{where} must be an object, got {_kind(call)}")
            call_id = call.get("id")
            if not isinstance(call_id, str) or not call_id:
                raise _Problem(f'{where} needs an "id" string')
            if call_id in self.waiting or call_id in self.answered or any(c.id == call_id for c in calls):
                raise _Problem(f"{where}: the call id {call_id!r} is already used by an earlier call")
            kind = call.get("type", "function")
            if kind != "function":
                raise _Problem(f'{where}: unsupported type {kind!r} (only "function")')
            function = call.get("function")
            if not isinstance(function, dict):
                raise _Problem(f'{where} needs a "function" object')
            name = function.get("name")
            if not isinstance(name, str) or not name:
                raise _Problem(f'{where}.function needs a "name" string')
            calls.append(ToolCall(id=call_id, name=name, arguments=_arguments(function.get("arguments"), where)))
        for c in calls:
            self.waiting[c.id] = c.name
        return calls


def carried_user_messages(summary: str) -> list[str]:
    """The user messages a summary's "All user messages" section quotes (one `- ` item each)."""
    lines = summary.splitlines()
    for i, line in enumerate(lines):
        m = _HEADING.match(line) if line.startswith("#") else None
        if m and m[1].strip().lower() == USER_MESSAGES_HEADING.lower():
            carried = []
            for item in lines[i + 1 :]:
                if item.startswith("#") and _HEADING.match(item):
                    break
                if item.startswith("- "):
                    carried.append(item[2:].strip())
            return carried
    return []


def _cmdc_metadata(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Problem(f'"cmdc" must be an object, got {_kind(value)}')
    metadata = {_CMDC_PREFIX + str(k): v for k, v in value.items()}
    pinned = metadata.get(PINNED_KEY)
    if pinned is not None and not isinstance(pinned, bool):
        raise _Problem(f'"cmdc": "pinned" must be true or false, got {pinned!r}')
    return metadata


def _arguments(value: object, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        raise _Problem(f"{where}.function.arguments must be a JSON string, got {_kind(value)}")
    if not value.strip():
        return {}
    try:
        decoded = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise _Problem(f"{where}.function.arguments is not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(decoded, dict):
        raise _Problem(f"{where}.function.arguments must encode a JSON object, got {_kind(decoded)}")
    return decoded


def _content(obj: Mapping[str, Any], role: str, *, images: bool) -> str | tuple[Part, ...]:
    if "content" not in obj or obj["content"] is None:
        raise _Problem(f'a {role} message needs "content"')
    value = obj["content"]
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _Problem(f'"content" must be a string or an array of parts, got {_kind(value)}')
    parts: list[Part] = []
    for i, part in enumerate(value):
        where = f"content[{i}]"
        if not isinstance(part, dict):
            raise _Problem(f"{where} must be an object, got {_kind(part)}")
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise _Problem(f'{where} needs a "text" string')
            parts.append(TextPart(text))
        elif kind == "image_url" and images:
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url:
                raise _Problem(f'{where} needs "image_url": {{"url": ...}}')
            parts.append(ImagePart(url))
        elif kind == "image_url":
            raise _Problem(f"{where}: a {role} message cannot hold images")
        else:
            raise _Problem(f'{where}: unsupported part type {kind!r} (expected "text" or "image_url")')
    return tuple(parts)


# -- writing ----------------------------------------------------------------------------------


def to_openai(message: Message, *, annotate: bool = False) -> dict[str, Any]:
    """The OpenAI-style object for `message`: its original object when it has one, else a
    conversion. `annotate`: add cmdc's metadata as a `"cmdc"` object (summaries and pins)."""
    source = message.metadata.get(SOURCE_KEY)
    if isinstance(source, Mapping):
        obj: dict[str, Any] = thaw(source)
    else:
        obj = _convert_back(message)
    if annotate:
        extra = {
            k[len(_CMDC_PREFIX) :]: thaw(v)
            for k, v in message.metadata.items()
            if k.startswith(_CMDC_PREFIX) and (message.is_summary or k == PINNED_KEY)
        }
        if extra:
            obj["cmdc"] = extra
    return obj


def _convert_back(message: Message) -> dict[str, Any]:
    role: str = message.metadata.get(ROLE_KEY, message.role)
    obj: dict[str, Any] = {"role": role}
    content = message.content
    if isinstance(content, str):
        obj["content"] = content if content or not message.tool_calls else None
    else:
        obj["content"] = [
            {"type": "text", "text": p.text}
            if isinstance(p, TextPart)
            else {"type": "image_url", "image_url": {"url": p.source}}
            for p in content
        ]
    if message.tool_calls:
        obj["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": orjson.dumps(c.to_dict()["arguments"]).decode()},
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        obj["tool_call_id"] = message.tool_call_id
    return obj


def encode_chat(objects: Sequence[Mapping[str, Any]], fmt: Format, envelope: Mapping[str, Any] | None = None) -> bytes:
    """The bytes of a conversation file in `fmt` (with `envelope`: a JSON object holding the
    messages under `"messages"` beside the envelope's keys)."""
    if fmt == "jsonl":
        return b"".join(orjson.dumps(o) + b"\n" for o in objects)
    if envelope is not None:
        return orjson.dumps({**envelope, "messages": list(objects)}, option=orjson.OPT_INDENT_2) + b"\n"
    return orjson.dumps(list(objects), option=orjson.OPT_INDENT_2) + b"\n"


def default_output(path: Path, fmt: Format) -> Path:
    """`<stem>.compacted.jsonl` / `.json` beside the input."""
    return path.with_name(f"{path.stem}.compacted.{fmt}")


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to `path` durably through an unpredictable temp file created with
    `O_EXCL | O_NOFOLLOW` beside it, fsync'd, renamed, the directory fsync'd (`_fs.atomic_write`)."""
    atomic_write(path, data, mode)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def agent_id_for(path: Path) -> str:
    """A valid agent id from a file name: its stem with other characters replaced by `_`."""
    stem = _UNSAFE.sub("_", path.stem).strip("._-")[:128].rstrip("._-")
    return stem or "conversation"


__all__ = [
    "ChatFile",
    "ChatFileError",
    "Format",
    "agent_id_for",
    "default_output",
    "detect_format",
    "encode_chat",
    "read_chat",
    "read_stream",
    "to_openai",
    "write_atomic",
]
