"""The `cmdc` command: `cmdc demo`, `cmdc compact FILE`, `cmdc history DIR AGENT`.

Exit codes, the same in every subcommand (`EXIT_CODES`):

- 0: done.
- 1: the work failed: a turn, a summarizer or a retention check failed, a store or its server
  failed or could not be reached (PostgreSQL down: `StoreUnavailable`), a write failed, a
  journal checked with `--verify` is damaged.
- 2: the input or a usage error, found before any work: a bad flag or value (the subcommand's
  usage is printed), a missing, malformed or non-regular input file, a directory that cannot
  be used (cannot be created or written), an unsafe agent id, no journal for that agent.
  Nothing has been written.
- 130: interrupted (Ctrl-C); 141: stdout closed early (`cmdc history ... | head`).

`-` reads standard input where a file is read (`cmdc compact -`), and writes to standard
output where one is written (`--out -`, `history --markdown -`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

import attrs
import orjson
import trio

from .._check import is_int
from .._redact import redact_url
from .._trio import one_of, reraise
from .._version import __version__, install_hint
from ..compaction import Compacted, CompactionReport, Compactor, ExtractiveSummarizer, Skipped
from ..compaction.summary import Summarizer
from ..errors import (
    ChatFileError,
    CmdcError,
    CompactionIncomplete,
    ConfigError,
    DemoError,
    OffloadCorrupted,
    OffloadError,
    StoreUnavailable,
    UsageError,
)
from ..events import JOURNAL_DAMAGED, Event
from ..message import Message, encode_default
from ..state import ENCODE_EAGERLY, State, validate_agent_id
from ..store import JournalReader, Store, open_store
from ..store.file.journal import JournalRecord, JournalReport, OffloadStore
from ..store.fs import os_cause, probe_dir, stricter_mode
from ..store.transcript import transcript_pieces
from ._chatfile import (
    STDIN,
    ChatFile,
    agent_id_for,
    default_output,
    encode_chat,
    read_chat,
    read_stream,
    to_openai,
    write_atomic,
)
from ._demo import MIN_WINDOW, DemoOptions, real_provider, run_demo, until_interrupted

DEFAULT_OFFLOAD = Path(".cmdc") / "conversation_history"

EXIT_CODES = {0: "done", 1: "the work failed", 2: "the input or a usage error (nothing written)"}


class _Parser(argparse.ArgumentParser):
    """argparse, but errors raise `UsageError` instead of exiting, so `main` returns a code."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise UsageError(message)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0-65535 (0: any free port), got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value < 60:
        raise argparse.ArgumentTypeError(f"must be in [0, 60), got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cmdc",
        description="An actor runtime for LLM agents on trio, with durable context compaction.",
        epilog="Exit codes (every subcommand): 0 done, 1 the work failed (a turn, a summarizer, a store or "
        "server unreachable, a write), 2 the input or a usage error (nothing written). - is standard input.",
    )
    parser.add_argument("--version", action="version", version=f"cmdc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    demo = sub.add_parser(
        "demo",
        help="agents on a small context window compacting live, offline",
        description=(
            "N agents on SimulatedModel (offline, no keys), each working a long scripted task with tool calls "
            "on a small context window. The compaction trigger is 80% of the window and each request reserves "
            "23% of it for the reply (which the trigger does not count), so both automatic compactions and forced "
            "ones (after the model answers 'too long') happen. On a terminal a live table; otherwise one line "
            "per compaction and every 10 turns (progress goes to stderr). "
            "Ends with a table of compactions, tokens, journal sizes, tool calls that worked and retention checks; "
            "exits 1 if a turn or a check fails, or most tool calls fail."
        ),
    )
    demo.add_argument("--agents", type=_positive, default=8, help="agents (default 8)")
    demo.add_argument("--turns", type=_positive, default=40, help="turns per agent (default 40)")
    demo.add_argument(
        "--window",
        type=_positive,
        default=6_000,
        help=f"context window in tokens (default 6000, at least {MIN_WINDOW})",
    )
    demo.add_argument(
        "--offload-dir", type=Path, help="journal directory, kept (default: a temporary directory, removed at the end)"
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of the simulated models (default 0)")
    demo.add_argument(
        "--provider",
        choices=("simulated", "openai", "anthropic"),
        default="simulated",
        help="run the same workload against a real endpoint: openai (OPENAI_API_KEY, OPENAI_BASE_URL) or "
        f"anthropic (ANTHROPIC_API_KEY); needs the http extra: {install_hint('http')}",
    )
    demo.add_argument("--model", help="the model name, with --provider openai|anthropic")
    demo.add_argument(
        "--summarizer",
        choices=("extractive", "model"),
        help="who writes summaries: the offline extractive summarizer (default with the simulated model) "
        "or the agents' own model (default with a real provider)",
    )
    demo.add_argument(
        "--latency", type=_seconds, default=0.05, help="seconds each simulated model call takes (default 0.05)"
    )
    demo.add_argument("--plain", action="store_true", help="plain event lines even on a terminal")
    demo.add_argument(
        "--trace",
        action="store_true",
        help="then print agent-1's session as an OpenTelemetry span tree (turns, model requests, tool calls, "
        "compactions, with durations and figures); needs opentelemetry-sdk. Short runs read best: "
        "--agents 1 --turns 6",
    )
    demo.add_argument(
        "--ui",
        action="store_true",
        help="also serve the local web page of the agents (prints its URL; needs the ui extra: "
        f"{install_hint('ui')}); the demo keeps running, the page open, until Ctrl-C",
    )
    demo.add_argument("--ui-port", type=_port, help="with --ui, the web page's port (default: a free one)")

    compact = sub.add_parser(
        "compact",
        help="compact a conversation file (JSONL or a JSON array of OpenAI-style chat messages)",
        description=(
            "Read a conversation file (JSONL, one OpenAI-style chat message per line, or a JSON array of them), "
            "compact it now (a manual compaction), write the compacted conversation in the same format and the "
            "evicted messages to the journal, and print the report. Kept messages are written exactly as they "
            "were; the summary is a user message (an OpenAI-style consumer takes the output as it is). The whole "
            "file is checked before anything is written."
        ),
    )
    compact.add_argument("file", metavar="FILE", help="the conversation file, or - for standard input")
    compact.add_argument(
        "--out",
        help="the compacted conversation (default FILE's stem + .compacted.jsonl / .json; with FILE -, or "
        "--out -: standard output, and the report goes to stderr)",
    )
    compact.add_argument(
        "--offload-dir",
        type=_dir_or_url,
        help=f"journal directory (default {DEFAULT_OFFLOAD} in FILE's directory, so the journal stays with "
        "the conversation whatever the working directory)",
    )
    compact.add_argument("--agent", help="the journal's agent id (default FILE's stem, made safe)")
    compact.add_argument("--keep", type=_positive, default=6, help="messages kept verbatim at the end (default 6)")
    compact.add_argument(
        "--summarizer",
        choices=("extractive", "openai", "anthropic"),
        default="extractive",
        help="extractive (offline, default), or a model: openai / anthropic with --model",
    )
    compact.add_argument("--model", help="the summarizer's model, with --summarizer openai|anthropic")
    compact.add_argument("--instruction", help='an instruction for this summary, e.g. "focus on the API changes"')
    compact.add_argument(
        "--annotate",
        action="store_true",
        help='add a "cmdc" object (kind, journal, records) to the summary message. Off by default: '
        "OpenAI's API and some compatible servers have refused unknown message keys",
    )

    history = sub.add_parser(
        "history",
        help="list, search, show or render an agent's offload journal",
        description="Read DIR/AGENT.jsonl: without options, list every record (seq, compaction, role, first line). "
        "Where DIR is writable, the journal's index DIR/AGENT.jsonl.index (a cache, mode 0600 as the journal) is "
        "built or brought up to date (see --no-index); nothing else is written but by --repair and --markdown.",
    )
    history.add_argument(
        "dir", type=_dir_or_url, metavar="DIR", help="the offload directory, or a store URL (postgresql://...)"
    )
    history.add_argument("agent", metavar="AGENT", help="the agent id")
    mode = history.add_mutually_exclusive_group()
    mode.add_argument("--search", nargs="+", metavar="WORD", help="records matching these words, best first")
    mode.add_argument("--range", nargs=2, type=_positive, metavar=("FIRST", "LAST"), help="records FIRST-LAST in full")
    mode.add_argument(
        "--verify",
        action="store_true",
        help="read the whole journal and report damaged lines, uncommitted attempts and duplicates (exit 1 if damaged)",
    )
    mode.add_argument(
        "--repair",
        action="store_true",
        help="rewrite the journal keeping every valid line; damaged bytes go to DIR/AGENT.jsonl.damaged",
    )
    mode.add_argument(
        "--markdown",
        nargs="?",
        const="",
        metavar="OUT",
        help="write (refresh) the Markdown transcript DIR/AGENT.md and print its path; with OUT, write it to OUT "
        "instead (- prints it): nothing is then written beside the journal",
    )
    ui = sub.add_parser(
        "ui",
        help="serve a read-only local web page of a store's agents, journals and compactions",
        description=(
            "Serve a local web page (on 127.0.0.1) of the agents in a store: each agent's last checkpointed "
            "context, its compactions and its journal (search, ranges). Read-only. Prints the URL to open, with "
            f"its token; runs until Ctrl-C. Needs the ui extra: {install_hint('ui')}. For a running runtime "
            "use open_runtime(ui=True) or rt.serve_ui() instead (live updates)."
        ),
    )
    ui.add_argument("store", type=_dir_or_url, metavar="DIR", help="the store: a directory, or postgresql://...")
    ui.add_argument("--port", type=_port, default=0, help="the port (default: a free one)")
    ui.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1, this machine only)")

    history.add_argument(
        "--limit", type=_positive, help="at most N records (the listing: the last N; --search: default 10)"
    )
    history.add_argument(
        "--no-index",
        action="store_true",
        help="read the whole journal; never build or update its index DIR/AGENT.jsonl.index (a cache that "
        "makes --search, --limit and --range fast, built by any reader where DIR is writable)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `cmdc` command; return its exit code. Results go to stdout, progress, warnings
    (retries of a model provider, say) and errors to stderr. When stdout is closed early (`cmdc
    history ... | head`) it stops quietly with 141, as a command killed by SIGPIPE would."""
    handler = _log_to_stderr()
    try:
        return _main(argv)
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except BaseExceptionGroup as group:  # from inside a nursery (the demo)
        if group.subgroup(KeyboardInterrupt) is not None:  # Ctrl-C in the middle of the demo's turns
            print("cmdc: interrupted", file=sys.stderr)
            return 130
        if group.split(BrokenPipeError)[1] is not None:
            raise
        _silence_stdout()
        return 141
    finally:
        logging.getLogger("cmdc").removeHandler(handler)
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.flush()


def _log_to_stderr() -> logging.Handler:
    """cmdc's warnings (`cmdc.*` loggers) as `cmdc: ...` lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("cmdc: %(message)s"))
    logging.getLogger("cmdc").addHandler(handler)
    return handler


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so flushing what is still buffered at exit does not fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the subcommand's parser, so its usage is the one printed
            _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    except UsageError as exc:
        print(f"cmdc: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        if args.command == "demo":
            return _demo_command(args)
        if args.command == "compact":
            return _compact(args)
        if args.command == "ui":
            return _ui(args)
        return _history(args)
    except (UsageError, ChatFileError, DemoError) as exc:
        print(f"cmdc {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except CmdcError as exc:
        print(f"cmdc {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise  # stdout closed by its reader: see main
    except OSError as exc:
        print(f"cmdc {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"cmdc {args.command}: interrupted", file=sys.stderr)
        return 130


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The parser of subcommand `command` (the top-level one without a subcommand)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            sub: argparse.ArgumentParser = action.choices[command]
            return sub
    return parser


def _usable_dir(directory: Path, what: str) -> None:
    """Refuse (`UsageError`) a directory that cannot be used, before anything is written: its
    nearest existing ancestor must be a directory in which a probe file can be created,
    written, fsync'd and removed (nothing is created on the way: a missing directory is made
    by the work)."""
    existing = directory
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{what} {directory}: {existing} is not a directory")
    try:
        probe_dir(existing)
    except OSError as exc:
        raise UsageError(f"{what} {directory}: cannot write in {existing}: {os_cause(exc)}") from None


# -- demo ---------------------------------------------------------------------------------------


def _demo_command(args: argparse.Namespace) -> int:
    if args.provider == "simulated" and args.model:
        raise UsageError("--model goes with --provider openai|anthropic")
    if args.ui_port is not None and not args.ui:
        raise UsageError("--ui-port goes with --ui")
    options = DemoOptions(
        agents=args.agents,
        turns=args.turns,
        window=args.window,
        offload_dir=args.offload_dir,
        seed=args.seed,
        provider=args.provider,
        model=args.model,
        summarizer=args.summarizer,
        latency=args.latency,
        display="plain" if args.plain else "auto",
        trace=args.trace,
        ui=(args.ui_port or 0) if args.ui else None,
    )
    if args.window < MIN_WINDOW:
        raise UsageError(
            f"--window must be at least {MIN_WINDOW} tokens (room for the tool schemas, the pinned task, "
            f"a summary and a reply), got {args.window}"
        )
    if args.offload_dir is not None and args.offload_dir.exists() and not args.offload_dir.is_dir():
        raise UsageError(f"--offload-dir {args.offload_dir} exists and is not a directory")
    if args.offload_dir is not None:
        _usable_dir(args.offload_dir, "--offload-dir")
    code, _stats = trio.run(run_demo, options)
    return code


# -- ui -----------------------------------------------------------------------------------------


def _ui(args: argparse.Namespace) -> int:
    if isinstance(args.store, Path) and not args.store.is_dir():
        raise UsageError(f"{args.store} is not a directory (give a store directory or a postgresql:// URL)")
    from ..ui import serve_store

    def ready(server: Any) -> None:
        print(f"cmdc ui: serving {args.store} read-only; open {server.url}", flush=True)
        print("press Ctrl-C to stop", file=sys.stderr, flush=True)

    async def stop_at_interrupt(scope: trio.CancelScope) -> None:
        await until_interrupted()
        scope.cancel()

    async def run() -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stop_at_interrupt, nursery.cancel_scope)
                await serve_store(os.fspath(args.store), port=args.port, host=args.host, on_ready=ready)
        except BaseExceptionGroup as group:  # the server's own error, as itself (out of nested nurseries)
            if len(group.exceptions) != 1:
                raise
            reraise(one_of(group))

    trio.run(run)
    return 0


# -- compact ------------------------------------------------------------------------------------


def _summarizer(args: argparse.Namespace) -> Summarizer:
    if args.summarizer == "extractive":
        if args.model:
            raise UsageError("--model goes with --summarizer openai|anthropic")
        return ExtractiveSummarizer()
    try:
        provider = real_provider(args.summarizer, args.model)
    except DemoError as exc:
        raise UsageError(str(exc).replace("--provider", "--summarizer")) from None
    return provider


def _compact(args: argparse.Namespace) -> int:
    """Check everything (the file, the agent id, the paths, the summarizer's settings), then
    compact (the journal is written first), then write the output."""
    piped = args.file == "-"
    path = STDIN if piped else Path(args.file)
    # every message is checked and converted before any write; standard input is read with a bound
    chat = read_chat(path, read_stream(sys.stdin.buffer) if piped else None)
    chat = attrs.evolve(chat, messages=_stable_ids(chat.messages))  # the first ones are let go
    if args.agent is not None:
        try:
            agent = validate_agent_id(args.agent)
        except ConfigError as exc:
            raise UsageError(f"--agent: {exc}") from None
    else:
        agent = agent_id_for(path)
    to_stdout = args.out == "-" or (piped and args.out is None)
    out: Path = Path(args.out) if args.out and not to_stdout else default_output(path, chat.format)
    # absolute, so the summary names a journal that can be found from anywhere
    url = args.offload_dir if isinstance(args.offload_dir, str) else None  # a store URL
    offload = (Path(".") if url is not None else (args.offload_dir or path.parent / DEFAULT_OFFLOAD)).absolute()
    if not to_stdout and out.is_dir():
        raise UsageError(f"--out {out} is a directory")
    if not to_stdout and not out.parent.is_dir():
        raise UsageError(f"--out {out}: no such directory {out.parent}")
    if url is None and offload.exists() and not offload.is_dir():
        raise UsageError(f"--offload-dir {offload} exists and is not a directory")
    if url is None:
        _usable_dir(offload, "--offload-dir")
    if not to_stdout:
        _usable_dir(out.parent, "--out")
    summarizer = _summarizer(args)
    lazy = ENCODE_EAGERLY.set(False)  # the file's JSON is built while journaled, a batch at a time
    try:
        state = State(
            agent_id=agent,
            messages=chat.messages,
            config={"compact_keep": ("messages", args.keep), "compact_offload_dir": str(offload)},
            compactions=_last_compaction(chat),
        )
    finally:
        ENCODE_EAGERLY.reset(lazy)
    if args.summarizer != "extractive":  # a model may take a while: say what is going on
        print(f"cmdc compact: summarizing with {args.summarizer} {args.model} ...", file=sys.stderr, flush=True)
    result = trio.run(_run_compaction, state, summarizer, args.instruction, url)
    if not isinstance(result, Compacted):
        print(f"{path}: nothing to compact ({result.reason}); {len(chat.messages)} messages, nothing written")
        return 0
    objects = [to_openai(m, annotate=args.annotate) for m in result.state.messages]
    data = encode_chat(objects, chat.format, chat.envelope)
    if to_stdout:  # the conversation on stdout, the report on stderr
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        _print_report(chat, Path("-"), result.report, result.state, url, file=sys.stderr)
        return 0
    # 0600, or the input's mode when it is stricter: the output holds the same conversation
    write_atomic(out, data, mode=stricter_mode(path))
    _print_report(chat, out, result.report, result.state, url)
    return 0


def _stable_ids(messages: Sequence[Message]) -> tuple[Message, ...]:
    """Messages read from a file have no ids: give each one derived from its content and all
    that came before it, so compacting the same file again journals nothing twice."""
    out: list[Message] = []
    digest = b""
    sha256, dumps, sort = hashlib.sha256, orjson.dumps, orjson.OPT_SORT_KEYS
    for m in messages:
        data = m._plain()  # to_dict() without the copy: the same JSON with sorted keys
        del data["id"]
        digest = sha256(digest + dumps(data, default=encode_default, option=sort)).digest()
        out.append(m._with_id("f" + digest[:12].hex()))
    return tuple(out)


async def _run_compaction(
    state: State, summarizer: Summarizer, instruction: str | None, url: str | None = None
) -> Compacted | Skipped:
    store = None if url is None else open_store(url)
    try:
        if store is not None:
            await store.start()  # an unreachable server fails here (1), whatever the file holds
        return await Compactor(summarizer, store=store).force_compact(state, instruction=instruction, reason="manual")
    except CompactionIncomplete as exc:  # compacted, but the kept messages alone are still large
        print(f"cmdc compact: warning: {exc}", file=sys.stderr)
        assert isinstance(exc.state, State) and isinstance(exc.report, CompactionReport)
        return Compacted(exc.state, exc.report)
    finally:
        close = getattr(summarizer, "aclose", None)
        if close is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await close()
        if store is not None:
            with trio.CancelScope(shield=True):
                await store.aclose()


def _last_compaction(chat: ChatFile) -> int:
    """The number of the latest summary in the file (so new ones continue from it), else 0."""
    numbers = [m.metadata.get("cmdc.compaction") for m in chat.messages if m.is_summary]
    return max((n for n in numbers if is_int(n) and n >= 0), default=0)


def _print_report(
    chat: ChatFile, out: Path, r: CompactionReport, state: State, url: str | None = None, file: TextIO | None = None
) -> None:
    file = file or sys.stdout
    head = f"compacted {chat.path} ({chat.format}, {r.messages_before} messages)"
    print(f"{head} -> {out} ({r.messages_after} messages)", file=file)
    print(f"  tokens:     {r.tokens_before:,} -> {r.tokens_after:,} (summary {r.summary_tokens:,})", file=file)
    print(f"  evicted:    {r.evicted} messages -> {r.offload_path} (records {r.first_seq}-{r.last_seq})", file=file)
    print(
        f"  summarizer: {r.summarizer}, {r.attempts} attempt(s), {r.passes} pass(es), {r.duration * 1000:.0f} ms",
        file=file,
    )
    print(
        f"  agent:      {state.agent_id} (compaction #{r.compaction}; read it back: cmdc history "
        f"{redact_url(url) if url is not None else Path(r.offload_path).parent} {state.agent_id})",
        file=file,
    )


# -- history ------------------------------------------------------------------------------------


def _dir_or_url(text: str) -> Path | str:
    """A directory, or a store URL kept as it is (a Path would fold its `//`). Another URL is
    refused as one (it was named as the directory `http:/host/x`)."""
    if text.startswith(("postgresql://", "postgres://")):
        return text
    scheme, sep, _ = text.partition("://")
    if sep and scheme.isalpha() and not os.path.lexists(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a store: give a directory or a postgresql:// URL")
    return Path(text)


def _history(args: argparse.Namespace) -> int:
    if isinstance(args.dir, str):
        return _history_store(args)
    directory: Path = args.dir
    try:
        agent = validate_agent_id(args.agent)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if not directory.exists():
        raise UsageError(f"{directory}: no such directory")
    if not directory.is_dir():
        raise UsageError(f"{directory}: not a directory")
    if not os.access(directory, os.R_OK | os.X_OK):
        raise UsageError(f"{directory}: cannot read the directory (permission denied)")
    # the journal's index (DIR/AGENT.jsonl.index, a cache) is built or brought up to date only
    # where the directory can be written (and not with --no-index): otherwise nothing is written
    store = OffloadStore(directory, index=not args.no_index and _writable(directory))
    journal = store.path_for(agent)
    if journal.exists() and not journal.is_file():
        raise UsageError(f"{journal}: not a regular file, so not a journal")
    if not journal.is_file():
        known = sorted(p.stem for p in directory.glob("*.jsonl") if p.is_file())
        hint = f"; journals there: {', '.join(known[:20])}" if known else "; there are no journals there"
        raise UsageError(f"{journal}: no journal for agent {agent!r}{hint}")
    if args.range and args.range[0] > args.range[1]:
        raise UsageError(f"--range {args.range[0]} {args.range[1]}: FIRST must not be after LAST")
    if args.markdown and args.markdown != "-":
        target = Path(args.markdown)
        if target.is_dir() or not target.parent.is_dir():
            raise UsageError(f"--markdown {target}: not a file path in an existing directory")
    damaged: list[Event] = []
    store.on_event = damaged.append
    try:
        code = trio.run(_show_history, args, store, agent, journal)
    except OffloadCorrupted as exc:
        raise UsageError(f"the journal is damaged: {exc}") from None
    except OffloadError as exc:
        raise UsageError(str(exc)) from None
    warned = False
    for event in damaged[:1]:
        if event.kind == JOURNAL_DAMAGED and not args.verify:  # --verify's report lists each damaged line
            warned = True
            print(
                f"cmdc history: warning: {event.data['damaged']} damaged line(s) in {journal} skipped; "
                f"see `cmdc history {args.dir} {agent} --verify`, fix with --repair",
                file=sys.stderr,
            )
    if not (warned or args.verify or args.repair) and _ends_mid_line(journal):
        print(
            f"cmdc history: warning: {journal} ends in an incomplete line (a write cut short, or one in "
            f"progress): not shown; see `cmdc history {args.dir} {agent} --verify`",
            file=sys.stderr,
        )
    return code


def _writable(directory: Path) -> bool:
    """Whether this process may create files in `directory`."""
    return os.access(directory, os.W_OK | os.X_OK)


def _ends_mid_line(path: Path) -> bool:
    """Whether the file's last byte is not a newline (a torn tail, which readers skip silently)."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return False
            f.seek(size - 1)
            return f.read(1) != b"\n"
    except OSError:
        return False


async def _print_search(store: JournalReader, agent: str, args: argparse.Namespace) -> int:
    """`cmdc history ... --search WORDS`: the best records, one line each."""
    query = " ".join(args.search)
    hits = await store.search(agent, query, limit=args.limit or 10)
    if not hits:
        print(f"no records match {query!r}")
    for record in hits:
        print(_line(record, _snippet(record.message, args.search)))
    return 0


def _print_journal_report(report: JournalReport, *, repaired: bool) -> None:
    print(f"journal {report.path} (id {report.journal or 'none'}, {report.size:,} bytes)")
    print(f"  {report.records} records from {report.compactions} compaction(s)")
    print(f"  {report.uncommitted} record(s) of attempts never committed (invisible to readers)")
    if report.duplicates:
        print(f"  {report.duplicates} duplicate record(s) hidden (each message is read once)")
    for d in report.damaged:
        print(f"  damaged: line {d.line} (byte {d.offset}, {d.length} bytes): {d.reason}")
    if report.torn:
        print(f"  torn: {report.torn} bytes after the last complete line")
    if repaired and report.side_file is not None:
        print(f"repaired: {report.moved:,} damaged bytes moved to {report.side_file}; every valid line kept")
    elif report.clean:
        print("clean: no damaged line")


async def _show_history(args: argparse.Namespace, store: OffloadStore, agent: str, journal: Path) -> int:
    if args.verify:
        report = await store.verify(agent)
        _print_journal_report(report, repaired=False)
        index = await store.check_index(agent)
        if index.note:
            print(f"index {index.path}: {index.note}")
        elif index.ok:
            print(f"index {index.path}: ok ({index.records} records)")
        for problem in index.problems:
            print(f"index {index.path}: {problem}")
        if index.problems and index.rebuilt:
            print(f"index {index.path}: rebuilt from the journal ({index.records} records)")
        return 0 if report.clean and index.ok else 1
    if args.repair:
        report = await store.repair(agent)
        _print_journal_report(report, repaired=True)
        return 0
    if args.markdown is not None:
        if not args.markdown:  # the transcript beside the journal, written or refreshed
            print(await store.write_transcript(agent))
            return 0
        # to stdout or OUT only: nothing is written beside the journal
        data = _transcript(await store.records(agent))
        if args.markdown == "-":
            sys.stdout.flush()
            for piece in data:
                sys.stdout.buffer.write(piece)
            sys.stdout.buffer.flush()
        else:
            target = Path(args.markdown)
            await trio.to_thread.run_sync(write_atomic, target, b"".join(data), stricter_mode(target))
            print(args.markdown)
        return 0
    if args.search:
        return await _print_search(store, agent, args)
    # the range, the last N and the counts come from the journal's index: only what is printed is read
    if args.range:
        first, last = args.range
        chosen = await store.read_range(agent, first, last)
        if not chosen:
            extent = await store.extent(agent)
            span = f"{extent.first_seq}-{extent.last_seq}" if extent.records else "none"
            print(f"no records in {first}-{last} (the journal holds records {span})")
        for record in chosen:
            print(_full(record))
        return 0
    extent = await store.extent(agent)
    shown = await (store.last_records(agent, args.limit) if args.limit else store.records(agent))
    for record in shown:
        print(_line(record, _first_line(record.message)))
    print(f"{extent.records} records from {extent.compactions} compaction(s) in {journal}")
    return 0


def _transcript(records: Sequence[JournalRecord]) -> list[bytes]:
    """The Markdown transcript of `records` (as `OffloadStore.write_transcript` writes it), in pieces."""
    batches: list[list[JournalRecord]] = []
    for r in records:
        if not batches or batches[-1][-1].compaction != r.compaction:
            batches.append([])
        batches[-1].append(r)
    return [p for b in batches for p in transcript_pieces(b[0].compaction, [(r.seq, r.message) for r in b])]


def _history_store(args: argparse.Namespace) -> int:
    """`cmdc history URL AGENT`: the same views over a store (its search is the store's own)."""
    try:
        agent = validate_agent_id(args.agent)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.range and args.range[0] > args.range[1]:
        raise UsageError(f"--range {args.range[0]} {args.range[1]}: FIRST must not be after LAST")
    try:
        store = open_store(args.dir)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    try:
        code: int = trio.run(_show_store_history, args, store, agent)
    except StoreUnavailable:
        raise  # the server failed or cannot be reached: the work failed (1), as in every subcommand
    except OffloadError as exc:
        raise UsageError(str(exc)) from None
    return code


async def _show_store_history(args: argparse.Namespace, store: Store, agent: str) -> int:
    try:
        await store.start()
        if args.repair:
            report = await store.repair(agent)
            if report.journal is None and not report.records and not report.uncommitted and not report.damaged:
                raise UsageError(f"{store.location(agent)}: no journal for agent {agent!r}")
            print(f"journal {store.location(agent)} (id {report.journal or 'none'})")
            print(f"  {report.records} records from {report.compactions} compaction(s)")
            if report.moved:
                print(f"repaired: {report.moved} damaged record(s) moved aside; every valid record kept")
            else:
                print("clean: nothing to repair")
            return 0
        if args.verify:
            report = await store.verify(agent)
            if report.journal is None and not report.records and not report.uncommitted and not report.damaged:
                raise UsageError(f"{store.location(agent)}: no journal for agent {agent!r}")
            print(f"journal {store.location(agent)} (id {report.journal or 'none'})")
            print(f"  {report.records} records from {report.compactions} compaction(s)")
            print(f"  {report.uncommitted} record(s) of attempts never committed (invisible to readers)")
            if report.damaged:
                seqs = ", ".join("unreadable" if d < 0 else str(d) for d in report.damaged[:20])
                print(f"  damaged: {len(report.damaged)} record(s): {seqs}")
                return 1
            print("clean: no damaged record")
            return 0
        if args.markdown is not None:
            text = await store.transcript(agent)
            if args.markdown == "-":
                print(text, end="")
            elif args.markdown:
                await trio.to_thread.run_sync(write_atomic, Path(args.markdown), text.encode())
                print(args.markdown)
            else:
                print(text, end="")
            return 0
        if args.search:
            return await _print_search(store, agent, args)
        if args.range:
            first, last = args.range
            chosen = await store.read_range(agent, first, last)
            if not chosen:
                print(f"no records in {first}-{last}")
            for record in chosen:
                print(_full(record))
            return 0
        records = await store.records(agent)
        if not records:
            raise UsageError(f"{store.location(agent)}: no journal records for agent {agent!r}")
        shown = records[-args.limit :] if args.limit else records
        for record in shown:
            print(_line(record, _first_line(record.message)))
        compactions = len({r.compaction for r in records})
        print(f"{len(records)} records from {compactions} compaction(s) in {store.location(agent)}")
        return 0
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()


def _role(message: Message) -> str:
    role: str = message.role
    if message.is_summary:
        role = "summary"
    elif message.tool_call_id is not None:
        role = f"tool[{message.tool_call_id}]" + ("!" if message.is_error else "")
    return role


def _first_line(message: Message) -> str:
    text = message.text.strip()
    if text:
        first = text.splitlines()[0]
        more = " …" if len(text.splitlines()) > 1 else ""
        return first + more
    if message.tool_calls:
        return "-> " + ", ".join(f"{c.name}({_args(c.to_dict()['arguments'])})" for c in message.tool_calls)
    return "(empty)"


def _args(arguments: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in arguments.items())


def _line(record: JournalRecord, text: str) -> str:
    width = shutil.get_terminal_size((120, 24)).columns
    head = f"{record.seq:>6}  #{record.compaction:<3} {_role(record.message):<14} "
    line = head + " ".join(text.split())
    return line if len(line) <= max(width, 40) else line[: max(width, 40) - 1] + "…"


def _snippet(message: Message, words: Sequence[str]) -> str:
    """The first line of the message that holds one of `words`, else its first line."""
    wanted = [w.casefold() for w in " ".join(words).split()]
    for line in message.text.splitlines():
        low = line.casefold()
        if any(w in low for w in wanted):
            return line.strip()
    return _first_line(message)


def _full(record: JournalRecord) -> str:
    m = record.message
    lines = [f"── record {record.seq} · compaction {record.compaction} · {_role(m)} · id {m.id}"]
    for call in m.tool_calls:
        lines.append(f"   tool call {call.name} (id {call.id}): {_args(call.to_dict()['arguments'])}")
    if m.text:
        lines.append(m.text.rstrip("\n"))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
