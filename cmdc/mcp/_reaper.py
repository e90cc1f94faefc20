"""Runs one MCP server and, when it ends or is told to stop, ends everything it started.

    python -I -S _reaper.py PARENT_PID GRACE LIFELINE_FD COMMAND [ARG...]

`cmdc.mcp.stdio` starts this script (standard library only, no imports from cmdc: it runs
isolated, `-I -S`) in a new session, and it starts the server in a session of its own (its own
process group), on Linux as a child subreaper: every process the server starts, also one that
calls `setsid` or double-forks, is reparented to this script when its parent dies, never to
init. The server's stdin, stdout and stderr are this script's; this script keeps no copy.

It waits for the server, reaping orphans as they come. When the server exits, or this script
gets SIGTERM (from cmdc), or its lifeline ends (LIFELINE_FD is the read end of a pipe whose only
write end cmdc holds: the kernel closes it when cmdc's process ends, however it ends), it
sends SIGTERM to the server's process group and to every descendant it can find, waits up to
GRACE seconds for them to exit, sends SIGKILL to those left, reaps them all, and exits with the
server's status. Without a subreaper (not Linux) only the server's process group is ended.

Not `PR_SET_PDEATHSIG` on this script: the kernel sends that signal when the *thread* that
started the process ends, and trio starts processes from a worker thread that ends after ten
idle seconds, which would end a healthy server ten seconds after its start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class _Stop(Exception):
    """Raised by the signal handler to leave a blocking wait."""


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _descendants() -> list[int]:
    """Every process below this one (Linux: from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    todo = [os.getpid()]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found


def _signal_all(group: int, sig: int) -> None:
    for target in (-group, *_descendants()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, sig)


def _reap() -> tuple[bool, list[tuple[int, int]]]:
    """Reap what has exited: (whether children are left, [(pid, status)])."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False, reaped
        if pid == 0:
            return True, reaped
        reaped.append((pid, status))


def _end_all(group: int, grace: float) -> None:
    """SIGTERM to the group and every descendant, SIGKILL after `grace`; reap them all."""
    _signal_all(group, signal.SIGTERM)
    deadline = time.monotonic() + grace
    killed = False
    while True:
        left, _ = _reap()
        if not left and not _descendants():
            return
        if time.monotonic() >= deadline:
            if killed:  # an unkillable process (uninterruptible sleep): not ours to wait on forever
                return
            killed = True
            deadline = time.monotonic() + grace
            _signal_all(group, signal.SIGKILL)
        time.sleep(0.01)
        if killed:  # a process forked while being killed: kill its children too
            _signal_all(group, signal.SIGKILL)


def _watch(lifeline: int) -> None:
    """Block until the lifeline's write end is closed (cmdc stopped or died), then SIGTERM self."""
    with contextlib.suppress(OSError):
        while os.read(lifeline, 1):
            pass
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> int:
    parent, grace, lifeline, command = int(argv[0]), float(argv[1]), int(argv[2]), argv[3:]
    os.set_inheritable(lifeline, False)  # the server does not get it

    ending = False  # set once the loop below is left: a signal after that must not skip the clean-up

    def stop(_signum: int, _frame: object) -> None:
        if not ending:
            raise _Stop

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, stop)
    if os.getppid() != parent:  # cmdc died already
        return 1
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    try:
        server = os.fork()
    except (_Stop, OSError):
        return 1
    if server == 0:  # the server: its own session and process group, killed with this script
        try:
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            os.execvp(command[0], command)
        except BaseException as exc:  # exec failed: say why, on its stderr
            os.write(2, f"cannot start {command[0]!r}: {exc}\n".encode(errors="replace"))
        os._exit(127)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the server holds the pipes: their ends close when it (and its own) exit
        os.dup2(null, fd)
    status = 0
    try:
        threading.Thread(target=_watch, args=(lifeline,), daemon=True).start()
        while True:
            pid, got = os.waitpid(-1, 0)
            if pid == server:
                status = got
                ending = True
                break
    except (_Stop, ChildProcessError):
        pass
    ending = True
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # the clean-up is itself bounded
    _end_all(server, grace)
    return os.waitstatus_to_exitcode(status) if status else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
