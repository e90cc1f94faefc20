"""A small, hostile MCP server for the tests: newline-delimited JSON-RPC on stdin/stdout,
standard library only (it starts fast), no SDK.

    python tests/_support/mcp_hostile.py [--id-last] [--pids FILE] [--starts FILE] [--die-after-start N]

Tools:
- `echo(text)`: the text, and this server's pid.
- `huge(size, pause)`: a text result of `size` bytes of "x", written in 1 MiB pieces; with a
  `pause` file, it writes half, waits until that file exists, then writes the rest.
- `die()`: the server exits at once (status 3), mid-call.

`--id-last` writes replies with `"id"` last, as the TypeScript SDK does. `--pids FILE`: at
start, starts a child in its own process group (sleeping) and a grandchild that calls `setsid`
(double fork), and writes the three pids to FILE. `--starts FILE`: counts starts in FILE; with
`--die-after-start N`, a start past the N-th exits at once (a server that cannot come back).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

MARKER = "cmdc-hostile-mcp"


def reply(rid: object, result: object, id_last: bool) -> bytes:
    body = (
        {"result": result, "jsonrpc": "2.0", "id": rid} if id_last else {"jsonrpc": "2.0", "id": rid, "result": result}
    )
    return json.dumps(body).encode() + b"\n"


def write(data: bytes) -> None:
    out = sys.stdout.buffer
    out.write(data)
    out.flush()


def huge(rid: object, size: int, pause: str | None, id_last: bool) -> None:
    """A reply whose text is `size` bytes, written piece by piece (never built whole)."""
    head = b'{"jsonrpc": "2.0", "id": %s, "result": {"content": [{"type": "text", "text": "' % json.dumps(rid).encode()
    if id_last:
        head = b'{"result": {"content": [{"type": "text", "text": "'
    write(head)
    piece = b"x" * (1 << 20)
    left = size
    half = size // 2
    while left > 0:
        n = min(left, len(piece))
        write(piece[:n])
        left -= n
        if pause and size - left >= half:
            while not os.path.exists(pause):
                time.sleep(0.01)
            pause = None
    tail = b'"}], "isError": false}}'
    if id_last:
        tail = b'"}], "isError": false}, "jsonrpc": "2.0", "id": %s}' % json.dumps(rid).encode()
    write(tail + b"\n")


def spawn_family(path: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {MARKER}"])
    read, write_end = os.pipe()
    if os.fork() == 0:  # the double fork: a grandchild in a session of its own
        os.setsid()
        if os.fork() == 0:
            os.close(read)
            os.write(write_end, str(os.getpid()).encode())
            os.close(write_end)
            os.execv(sys.executable, [sys.executable, "-c", f"import time; time.sleep(600)  # {MARKER}"])
        os._exit(0)
    os.close(write_end)
    grandchild = int(os.read(read, 64))
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid} {grandchild}\n")
    os.replace(path + ".tmp", path)


def main(argv: list[str]) -> None:
    id_last = "--id-last" in argv
    option = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    if "--starts" in option:
        path = option["--starts"]
        starts = 1
        if os.path.exists(path):
            with open(path) as f:
                starts = int(f.read() or 0) + 1
        with open(path, "w") as f:
            f.write(str(starts))
        if starts > int(option.get("--die-after-start", "1000000")):
            sys.exit(4)
    if "--pids" in option:
        spawn_family(option["--pids"])
    tools = [
        {"name": "echo", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}},
        {
            "name": "huge",
            "inputSchema": {
                "type": "object",
                "properties": {"size": {"type": "integer"}, "pause": {"type": "string"}},
                "required": ["size"],
            },
        },
        {"name": "die", "inputSchema": {"type": "object", "properties": {}}},
    ]
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        message = json.loads(line)
        rid, method, params = message.get("id"), message.get("method"), message.get("params") or {}
        if rid is None:
            continue  # a notification
        if method == "initialize":
            result = {
                "protocolVersion": params.get("protocolVersion"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
            write(reply(rid, result, id_last))
        elif method == "tools/list":
            write(reply(rid, {"tools": tools}, id_last))
        elif method == "tools/call":
            name, args = params.get("name"), params.get("arguments") or {}
            if name == "huge":
                huge(rid, int(args["size"]), args.get("pause"), id_last)
            elif name == "die":
                os._exit(3)
            else:
                text = f"{args.get('text', '')} from {os.getpid()}"
                write(reply(rid, {"content": [{"type": "text", "text": text}], "isError": False}, id_last))
        elif method == "ping":
            write(reply(rid, {}, id_last))
        else:
            error = {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"unknown method {method}"}}
            write(json.dumps(error).encode() + b"\n")


if __name__ == "__main__":
    main(sys.argv[1:])
