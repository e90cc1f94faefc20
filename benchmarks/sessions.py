"""Seeded long agent coding sessions with planted ground truth (probes).

`generate(seed, turns)` writes a session of an agent working on a small Python service: file
reads of a few KB, greps, test runs with failures and error codes, edits, new files, a to-do
list kept with a `todo_write` tool, and user messages every few turns. Planted in it, in four
categories (the probes a compaction is scored on):

- recall: values the user or a tool stated once (ports, names, limits, error codes,
  requirements), each phrased by one of several templates per kind;
- artifact: files created, edited or read (path and what happened), commands and their outcome;
- continuation: the task, the current step, the open to-dos (and one that stays pending);
- decision: a choice and its reason.

Each value kind has training phrasings and held-out phrasings (`HELD_OUT`): the ledger's
heuristics were tuned on the first only, and a probe says which it used, so results are
reported for both. The decisions (`DECISIONS`) come in four sets: training, a first held-out
set (never read while designing), and two sets written later as held-out ones and then tuned
on (in-sample now); a probe's kind and `held_out` say which. `UNSEEN_DECISIONS` are phrasings
never used to design the reading, scored apart (`benchmarks.retention.unseen_decisions`): they
are not drawn by `generate`. Importable by the benchmarks and the tests.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs
import orjson

from cmdc import Message, ToolCall

RECALL, ARTIFACT, CONTINUATION, DECISION = "recall", "artifact", "continuation", "decision"
CATEGORIES = (RECALL, ARTIFACT, CONTINUATION, DECISION)

MODULES = (
    "billing", "auth", "export", "search", "upload", "notify", "metrics", "scheduler", "cache", "storage",
    "webhooks", "reports", "tenants", "audit", "quota", "sessions",
)  # fmt: skip
SERVICES = (
    "metrics exporter", "webhook relay", "admin API", "job runner", "preview server", "search indexer",
    "thumbnail worker", "auth proxy",
)  # fmt: skip
WORDS = (
    "amber", "basalt", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "kestrel",
    "lumen", "meridian", "nimbus", "onyx", "pylon", "quartz", "raven", "sierra", "tundra", "umber", "vesper",
)  # fmt: skip


@attrs.frozen
class Probe:
    """One planted fact. It passes at the context level when one unit of the context (a line of
    a summary, or a kept message with its tool results) holds every needle (case-insensitive)
    and, on the line of the first needle, none of `forbid`. `query` is the natural question
    the recall level searches for; `source` the message that stated it; `held_out` whether a
    held-out phrasing stated it; `until`: the turn from which it no longer applies."""

    category: str
    kind: str
    needles: tuple[str, ...]
    query: str
    source: str
    turn: int
    held_out: bool = False
    forbid: tuple[str, ...] = ()
    until: int | None = None


@attrs.frozen
class Session:
    """The messages in order, grouped by turn (one model request each: a turn's messages are
    appended together), and the probes."""

    turns: tuple[tuple[Message, ...], ...]
    probes: tuple[Probe, ...]

    @property
    def messages(self) -> list[Message]:
        return [m for t in self.turns for m in t]


# -- phrasings -------------------------------------------------------------------------------------
# {s}: a subject (a service, a module...), {v}: the value. Training phrasings first; HELD_OUT the rest.

PHRASINGS: dict[str, tuple[str, ...]] = {
    "port": (
        "The {s} has to listen on port {v}, not the default one.",
        "Oh, and the {s} runs on {v} in staging, so point the config there.",
        "Please use port {v} for the {s}; the usual one is taken on those hosts.",
        "Quick note before you continue: {s} port is {v}.",
    ),
    "name": (
        "The staging database for {s} is called {v}, please don't create a new one.",
        "We deploy {s} to the cluster named {v}.",
        "Heads up: the bucket for {s} is {v}.",
        "Use {v} as the queue name for the {s} jobs.",
    ),
    "limit": (
        "Uploads for {s} must stay under {v} MB.",
        "Keep the {s} timeout at {v} seconds, the load balancer cuts at 60 anyway.",
        "The {s} retries should never exceed {v} attempts.",
        "Rate limit for {s}: at most {v} requests per minute per tenant.",
    ),
    "requirement": (
        "Make sure {s} never logs {v}.",
        "Every {s} response must include {v}.",
        "For {s} we always store {v}, no exceptions.",
        "One rule for {s}: nothing may write {v}.",
    ),
}
HELD_OUT: dict[str, tuple[str, ...]] = {
    "port": (
        "FYI ops reserved {v} for the {s} on the new boxes.",
        "{s} \u2192 {v} (that's what the firewall lets through).",
    ),
    "name": (
        "Oh right, the {s} stuff lives in {v} now, the old one was retired.",
        "If you need the {s} account, it's {v}.",
    ),
    "limit": (
        "Anything above {v} per minute on {s} gets us throttled by the vendor, so cap it there.",
        "Our SLO says {s} answers within {v} ms at p99.",
    ),
    "requirement": (
        "Compliance flagged it last quarter: {s} keeps {v} out of every export.",
        "Reminder from security \u2014 {s} and {v} don't mix.",
    ),
}
QUERIES: dict[str, str] = {
    # what a model asks the recall tool for the value a phrasing stated: the subject and what the
    # value is (a port, a bucket, a timeout...), in its own words, never the value itself
    "The staging database for {s} is called {v}, please don't create a new one.":
        "what is the staging database for {s} called",
    "We deploy {s} to the cluster named {v}.": "which cluster do we deploy {s} to",
    "Heads up: the bucket for {s} is {v}.": "which bucket does {s} use",
    "Use {v} as the queue name for the {s} jobs.": "what is the queue name for {s} jobs",
    "Oh right, the {s} stuff lives in {v} now, the old one was retired.": "where does the {s} stuff live now",
    "If you need the {s} account, it's {v}.": "which account does {s} use",
    "Uploads for {s} must stay under {v} MB.": "how large may {s} uploads be in MB",
    "Keep the {s} timeout at {v} seconds, the load balancer cuts at 60 anyway.": "what is the {s} timeout",
    "The {s} retries should never exceed {v} attempts.": "how many retries are allowed for {s}",
    "Rate limit for {s}: at most {v} requests per minute per tenant.": "what is the rate limit for {s}",
    "Anything above {v} per minute on {s} gets us throttled by the vendor, so cap it there.":
        "when does the vendor throttle {s}",
    "Our SLO says {s} answers within {v} ms at p99.": "what is the {s} latency SLO",
    "Make sure {s} never logs {v}.": "what must {s} never log",
    "Every {s} response must include {v}.": "what must every {s} response include",
    "For {s} we always store {v}, no exceptions.": "what do we always store for {s}",
    "One rule for {s}: nothing may write {v}.": "what may nothing write in {s}",
    "Compliance flagged it last quarter: {s} keeps {v} out of every export.": "what must {s} keep out of exports",
    "Reminder from security \u2014 {s} and {v} don't mix.": "what did security say about {s}",
}  # fmt: skip
"""The recall probe's query per phrasing of a name, limit or requirement (a port's is the same
for every phrasing): the question names what is asked for. A single generic question per kind
("what is the limit for billing") named nothing the statement holds but its subject, a module
name found in thousands of records; the requirement's held the answer itself."""
REQUIREMENT_VALUES = (
    "raw card numbers", "the X-Request-Id header", "timestamps in UTC", "personal email addresses", "the tenant id",
    "plaintext passwords", "the Idempotency-Key", "amounts in integer cents",
)  # fmt: skip
MORE_REQUIREMENT_VALUES = (
    "session tokens", "the raw request body", "the customer's IP address", "stack traces", "the API key",
    "the X-Tenant-Id header", "the build number", "amounts with their currency", "the user's locale",
    "unsigned URLs", "the Retry-After header", "full names", "dates as ISO 8601", "the trace id",
    "phone numbers", "free-text notes", "the schema version", "the upload checksum", "the webhook signature",
    "birth dates", "the region code", "card expiry dates", "the ETag", "the audit actor",
)  # fmt: skip
"""Drawn only once every one of `REQUIREMENT_VALUES` is used (past about 450 turns): a shorter
session's draws, and so the session, are what they were."""
DECISIONS: tuple[tuple[str, ...], ...] = (
    ("Let's go with {a} rather than {b}, because {r}.", "train"),
    ("I'll use {a} instead of {b} since {r}.", "train"),
    ("We decided on {a} over {b}: {r}.", "train"),
    ("Going with {a}; {b} was the other option, but {r}.", "train"),
    ("After comparing them, {a} wins over {b} \u2014 {r}.", "held"),
    ("{a} it is, not {b}. Reason: {r}.", "held"),
    # Written after the ledger's decision reading was first designed (937902a) as held-out ones;
    # it missed most of them and was then extended on them, so they are in-sample now (kind
    # "decision_late" in the probes, counted with the training phrasings).
    ("{a}, then. {b} would have been fine too, except {r}.", "late"),
    ("Thinking about it more, {b} is out: {r}. So {a}.", "late"),
    ("My vote is {a} \u2014 {r}.", "late"),
    ("Can't do {b} here, {r}; {a} works.", "late"),
    ("Honestly {a} is the safer bet for us, {r}.", "late"),
    ("The answer's {a}. Reason: {r}.", "late"),
    ("{r}, which rules out {b}. Using {a}.", "late"),
    ("We're doing {a} and not {b} \u2014 {r}.", "late"),
    ("After looking at both I'm leaning {a}, mostly because {r}.", "late"),
    ("OK so {a} over {b}, {r} after all.", "late"),
    # Written after the extension above as held-out ones (kind "decision_fresh"); the reading
    # missed five of the eight and was extended on them in the retention work of issue 27, so
    # they are in-sample now too (counted with the training phrasings). `UNSEEN_DECISIONS` are
    # the held-out ones since.
    ("Between {a} and {b} I'd take {a}: {r}.", "fresh"),
    ("{b} looked tempting, but {r}, so {a} it is.", "fresh"),
    ("Let's not overthink it \u2014 {a}, since {r}.", "fresh"),
    ("Quick call on the stack: {a}. {r}, and that settles it.", "fresh"),
    ("I'd steer clear of {b} for now; {r}. {a} covers what we need.", "fresh"),
    ("If we're being practical, {a} beats {b} here because {r}.", "fresh"),
    ("Went back and forth on this one. Final answer: {a}, because {r}.", "fresh"),
    ("Keep it boring: {a}. {b} is nice, but {r}.", "fresh"),
)
UNSEEN_DECISIONS: tuple[str, ...] = (
    # Written for the retention work of issue 27 before the decision reading was changed, and
    # never used to design it: the honest figure for phrasings the ledger has not seen. Not used
    # by `generate` (its draws, and so every seed's session, stay as they were); scored by
    # `benchmarks.retention.unseen_decisions` over every choice in `CHOICES`.
    "We'll standardise on {a} going forward; {r}.",
    "{a} is what we're shipping with. {b} lost out because {r}.",
    "I compared {a} and {b}; {a} came out ahead since {r}.",
    "Decision: {a}. Why: {r}.",
    "Let's settle this \u2014 {a}. {r}.",
    "For this project {a} makes more sense than {b}, given that {r}.",
    "I'm switching us over to {a}, because {r}.",
    "Not {b}. {a}, since {r}.",
    "Ended up picking {a}: {r}.",
    "{a} gets the nod over {b} \u2014 {r}.",
    "Rather than {b}, we're going to rely on {a} as {r}.",
    "I've landed on {a}; {r}, and {b} doesn't give us that.",
    "Let's default to {a} \u2014 {b} can come later if needed, but right now {r}.",
    "Ok here's the plan: {a} instead of {b}, {r}.",
    "Choosing {a}. Main reason is that {r}.",
    "{r}, so I'm going with {a}.",
)
UNSEEN_NON_DECISIONS: tuple[str, ...] = (
    # ... and sentences about the same choices that decide nothing (written with the above).
    "Should we go with {a} or {b}?",
    "I'm not sure yet whether {a} or {b} fits better.",
    "{a} and {b} both have trade-offs; let me read up first.",
    "Running the {a} benchmark now.",
    "Can you compare {a} and {b} for me?",
    "I looked at {a} yesterday.",
    "Both {a} and {b} are installed in the venv.",
    "The {a} docs are open in the other tab.",
)
CHOICES = (
    ("SQLite", "PostgreSQL", "the CLI must work offline", "offline"),
    ("orjson", "the stdlib json module", "the export path is CPU-bound", "CPU-bound"),
    ("httpx", "requests", "we need async clients in the workers", "async"),
    ("Redis streams", "RabbitMQ", "ops already run Redis", "ops already run Redis"),
    ("pydantic v2", "marshmallow", "validation was the hot spot in the profile", "hot spot"),
    ("structlog", "loguru", "it plugs into the stdlib handlers", "stdlib handlers"),
    ("a token bucket", "a fixed window counter", "bursts must be smoothed", "bursts"),
    ("Alembic", "hand-written SQL migrations", "rollbacks must be scripted", "rollbacks"),
    ("MinIO", "local disk", "the workers are stateless", "stateless"),
    ("ULIDs", "UUID4", "ids must sort by creation time", "sort by creation time"),
    ("ruff", "flake8", "it runs in CI in under a second", "under a second"),
    ("trio", "asyncio", "structured concurrency keeps cancellation sane", "cancellation"),
    ("argon2", "bcrypt", "the security review asked for a memory-hard hash", "memory-hard"),
    ("a monorepo", "separate repos", "the services share the schema package", "share the schema"),
    ("gRPC", "REST", "the mobile team wants streaming updates", "streaming"),
    ("Parquet", "CSV", "the analysts query it column by column", "column by column"),
    ("feature flags", "a long-lived branch", "merges kept breaking the release", "merges kept breaking"),
    ("cursor pagination", "offset pagination", "the tenants table is too big to count", "too big to count"),
    ("a read replica", "caching in the app", "the reports tolerate a few seconds of lag", "seconds of lag"),
    ("Caddy", "nginx", "it renews the certificates itself", "renews the certificates"),
    ("soft deletes", "hard deletes", "support restores accounts every week", "restores accounts"),
    ("uv", "pip-tools", "the lock step dropped from minutes to seconds", "minutes to seconds"),
)
MORE_CHOICES = (
    ("Kafka", "SQS", "we need to replay a week of events", "replay a week"),
    ("Terraform", "clicking in the console", "staging must be rebuilt from scratch", "rebuilt from scratch"),
    ("mypy strict", "pyright", "the CI image already ships it", "CI image"),
    ("Jinja", "f-strings", "the templates are edited by support", "edited by support"),
    ("a bloom filter", "a full set lookup", "the dedup table no longer fits in memory", "fits in memory"),
    ("ClickHouse", "TimescaleDB", "the dashboards scan billions of rows", "billions of rows"),
    ("Docker Compose", "Kubernetes", "the team is three people", "three people"),
    ("protobuf", "JSON payloads", "the payloads cross four services", "four services"),
    ("hypothesis", "hand-written cases", "the parser's edge cases keep surprising us", "edge cases"),
    ("systemd timers", "cron", "we want the runs in the journal", "runs in the journal"),
    ("WebSockets", "long polling", "the proxy idles connections out at 30 seconds", "idles connections"),
    ("Celery", "a hand-rolled queue", "retries with backoff come for free", "backoff"),
    ("zstd", "gzip", "the archives are read far more than written", "read far more"),
    ("OpenTelemetry", "StatsD", "the traces must cross the queue", "cross the queue"),
    ("Poetry", "setuptools", "the plugin needs lock files", "lock files"),
    ("FastAPI", "Flask", "the schema is generated from the types", "generated from the types"),
    ("DuckDB", "pandas", "the exports are larger than memory", "larger than memory"),
    ("Vault", "environment variables", "the secrets rotate every day", "rotate every day"),
    ("blue-green deploys", "rolling deploys", "a failed release must roll back in seconds", "roll back in seconds"),
    ("a circuit breaker", "more retries", "the vendor falls over under retry storms", "retry storms"),
    ("Sentry", "plain log scraping", "errors need the request context", "request context"),
    ("an outbox table", "dual writes", "a crash between the two writes lost events", "lost events"),
    ("mkdocs", "Sphinx", "the docs are all Markdown already", "all Markdown"),
    ("S3 lifecycle rules", "a cleanup job", "nobody owns the cron host", "nobody owns"),
    ("Playwright", "Selenium", "the UI tests flaked on every run", "flaked"),
    ("Pydantic settings", "configparser", "the settings need validation at start", "validation at start"),
    ("pgbouncer", "a bigger connection pool", "the database caps connections at 100", "caps connections"),
    ("ripgrep", "grep", "the monorepo search took a minute", "took a minute"),
)
"""Drawn only once every one of `CHOICES` is used (past about 440 turns)."""
FILLER = (
    "ok, go on.",
    "Looks fine so far, continue.",
    "Thanks. What's next?",
    "Sure, keep going with the plan.",
    "Good, carry on.",
    "hmm ok",
    "Can you check the tests again after that?",
    "Alright.",
)


# -- tool outputs ------------------------------------------------------------------------------------


def _code(rng: random.Random, module: str, lines: int) -> str:
    out = [f'"""The {module} module."""', "", "from __future__ import annotations", ""]
    while len(out) < lines:
        name = (
            f"{rng.choice(('load', 'save', 'check', 'build', 'parse', 'render', 'sync'))}_{module}_{rng.randint(1, 99)}"
        )
        out += [f"def {name}(item: dict[str, object], limit: int = {rng.randint(1, 500)}) -> bool:"]
        out += [f"    value = item.get({rng.choice(WORDS)!r})", "    if value is None:", "        return False"]
        out += [f"    return len(str(value)) < limit  # {rng.choice(WORDS)} {rng.randint(0, 9999)}", ""]
    return "\n".join(out)


def _test_output(rng: random.Random, module: str, failures: list[str], total: int) -> str:
    lines = ["============================= test session starts ==============================", ""]
    for i in range(total):
        name = f"test_{module}_{rng.choice(WORDS)}_{i}"
        lines.append(f"tests/test_{module}.py::{name} PASSED" + " " * 20 + f"[{100 * (i + 1) // total:>3}%]")
    lines += ["", "=" * 30 + " warnings summary " + "=" * 30]
    lines += [
        f"src/app/{module}.py:{rng.randint(1, 300)}: DeprecationWarning: utcnow() is deprecated" for _ in range(5)
    ]
    for f in failures:
        lines += ["", "_" * 30 + f" {f.split(' - ')[0].split('::')[-1]} " + "_" * 30, "", "    def test(): ..."]
        lines += [f"E   {f.split(' - ', 1)[-1]}", ""]
    lines += ["=========================== short test summary info ============================"]
    lines += [f"FAILED {f}" for f in failures]
    passed = total - len(failures)
    tail = f"{len(failures)} failed, {passed} passed" if failures else f"{passed} passed"
    lines += [f"======================= {tail} in {rng.uniform(0.5, 9):.2f}s ======================="]
    return "\n".join(lines)


def _grep(rng: random.Random, pattern: str, files: Sequence[str]) -> str:
    return "\n".join(
        f"{rng.choice(files)}:{rng.randint(1, 400)}:    {pattern}({rng.choice(WORDS)}, limit={rng.randint(1, 99)})"
        for _ in range(rng.randint(10, 60))
    )


# -- the generator -----------------------------------------------------------------------------------


class _Writer:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.turns: list[tuple[Message, ...]] = []
        self.probes: list[Probe] = []
        self.calls = 0
        self.used: set[str] = set()

    def unique(self, make: object) -> str:
        assert callable(make)
        for _ in range(1000):
            value = str(make())
            if value not in self.used:
                self.used.add(value)
                return value
        raise RuntimeError("no unique value")

    def call(self, name: str, **arguments: object) -> ToolCall:
        self.calls += 1
        return ToolCall(id=f"call_{self.calls}", name=name, arguments=arguments)

    def step(self, text: str, call: ToolCall, result: str, *, error: bool = False) -> Message:
        asking = Message.assistant(text, tool_calls=(call,))
        self.turns.append((asking, Message.tool_result(call.id, result, is_error=error)))
        return asking

    def probe(self, *args: object, **kwargs: object) -> None:
        self.probes.append(Probe(*args, **kwargs))  # type: ignore[arg-type]


def generate(seed: int = 0, turns: int = 400) -> Session:
    """A session of about `turns` turns (200 to 1,000 make sense; fewer work too)."""
    w = _Writer(seed)
    rng = w.rng
    modules = rng.sample(MODULES, 8)
    src = {m: f"src/app/{m}.py" for m in modules}
    tests = {m: f"tests/test_{m}.py" for m in modules}
    task = (
        f"We're adding multi-tenant support to the app: every {modules[0]}, {modules[1]} and {modules[2]} call "
        "must carry a tenant id, with tests. Work through it file by file and keep the test suite green."
    )
    system = Message.system("You are a careful coding agent. Use the tools; keep the user informed.")
    first = Message.user(task)
    w.turns.append((system, first))
    w.probe(CONTINUATION, "task", ("multi-tenant",), "what is the task we are working on", first.id, 0)

    # what gets planted, spread over the session
    kinds = ["port", "name", "limit", "requirement"]
    plan: dict[int, str] = {}
    slots = list(range(3, turns - 5))
    rng.shuffle(slots)
    n_values = max(8, turns // 12)
    n_decisions = max(4, turns // 20)
    for i, slot in enumerate(slots[:n_values]):
        plan[slot] = "value:" + kinds[i % len(kinds)]
    for slot in slots[n_values : n_values + n_decisions]:
        plan[slot] = "decision"
    for slot in slots[n_values + n_decisions : n_values + n_decisions + max(3, turns // 40)]:
        plan[slot] = "error_code"
    todos: list[list[str]] = []  # [text, status]
    pending_item = f"update the changelog for the {modules[3]} tenant header"
    pending_at = min(20, turns // 4)
    choices = list(CHOICES)
    rng.shuffle(choices)
    more_drawn = False
    phrasing_turn = 0
    failed: set[str] = set()  # modules whose tests failed with an error code

    def todo_call(t: int) -> None:
        items = [{"content": text, "status": status} for text, status in todos]
        w.step("Updating the to-do list.", w.call("todo_write", todos=items), "Todos updated.")
        for text, status in todos:
            if status == "in_progress":
                w.probe(CONTINUATION, "current_step", (text,), f"what am I working on now {text}", w.turns[-1][0].id, t)

    t = 1
    current = 0
    while t < turns:
        kind = plan.get(t)
        module = modules[current % len(modules)]
        if t % 25 == 1 and current < len(modules):  # a new step in the to-do list
            for item in todos:  # the step and its docs are done (the to-do tool says so)
                if item[1] == "in_progress" or (item[1] == "pending" and item[0] != pending_item):
                    item[1] = "completed"
            if todos:
                done = [x for x in todos if x[1] == "completed"]
                for d in done:
                    for p in list(w.probes):
                        if p.kind in ("todo", "current_step") and p.needles == (d[0],) and p.until is None:
                            w.probes[w.probes.index(p)] = attrs.evolve(p, until=t)
            todos.append([f"add the tenant id to {src[module]} and its tests", "in_progress"])
            todos.append([f"document the tenant header for {module} in docs/{module}.md", "pending"])
            if t >= pending_at and not any(x[0] == pending_item for x in todos):
                todos.append([pending_item, "pending"])
            todo_call(t)
            for text, status in todos:
                if status == "pending":
                    forbid = ("[x]", "completed", '"done"') if text == pending_item else ()
                    kind_name = "pending" if text == pending_item else "todo"
                    if not any(p.needles == (text,) and p.kind in ("todo", "pending") for p in w.probes):
                        w.probe(CONTINUATION, kind_name, (text,), f"open to-do {text}", w.turns[-1][0].id, t,
                                forbid=forbid)  # fmt: skip
            current += 1
            t += 1
            continue
        if kind is not None and kind.startswith("value:"):
            vk = kind.split(":", 1)[1]
            held = phrasing_turn % 3 == 2
            phrasing_turn += 1
            templates = HELD_OUT[vk] if held else PHRASINGS[vk]
            template = rng.choice(templates)
            subject, value, needles, query = _value(w, vk, modules)
            if template in QUERIES:
                query = QUERIES[template].format(s=subject)
            text = template.format(s=subject, v=value)
            text = text[0].upper() + text[1:]
            user = Message.user(text)
            w.turns.append((user, Message.assistant("Noted, I'll keep that in mind.")))
            w.probe(RECALL, vk, needles, query, user.id, t, held_out=held)
            t += 1
            continue
        if kind == "decision" and not choices and not more_drawn:  # a long session: more choices
            more_drawn = True
            choices = list(MORE_CHOICES)
            rng.shuffle(choices)
        if kind == "decision" and choices:
            a, b, reason, key = choices.pop()
            template, which = rng.choice(DECISIONS)
            text = template.format(a=a, b=b, r=reason)
            text = text[0].upper() + text[1:]
            if rng.random() < 0.5:
                msg = Message.user(text)
                w.turns.append((msg, Message.assistant(f"Understood, {a} then.")))
            else:
                msg = Message.assistant(text)
                w.turns.append((msg,))
            kind_name = {"late": "decision_late", "fresh": "decision_fresh"}.get(which, "decision")
            held = which == "held"
            w.probe(DECISION, kind_name, (a, key), f"why did we choose {a}", msg.id, t, held_out=held)
            t += 1
            continue
        if kind == "error_code":
            # a module whose tests have not failed with a code yet (the probe's question names the
            # module: two codes of one module would be one question with two answers)
            module = next((m for m in modules[current % len(modules) :] + modules if m not in failed), module)
            failed.add(module)
            code = w.unique(lambda: f"E{rng.randint(1000, 9999)}")
            failure = (
                f"{tests[module]}::test_{module}_tenant - {module}.errors.TenantError: [{code}] tenant header missing"
            )
            command = f"python -m pytest {tests[module]} -q"
            asking = w.step(
                "Running the tests.", w.call("bash", command=command), _test_output(rng, module, [failure], 30)
            )
            w.probe(RECALL, "error_code", (code,), f"what error code did the {module} tests fail with", asking.id, t)
            t += 1
            continue
        # an ordinary turn: read, grep, edit, create, test, or a user note
        r = rng.random()
        if r < 0.30:
            path = rng.choice([src[module], tests[module], f"src/app/{rng.choice(MODULES)}.py"])
            asking = w.step(
                f"Reading {path}.", w.call("read_file", path=path), _code(rng, module, rng.randint(160, 480))
            )
            if rng.random() < 0.15:
                w.probe(ARTIFACT, "read", (path,), f"which files did we read {path}", asking.id, t)
        elif r < 0.42:
            pattern = f"{rng.choice(('load', 'check', 'tenant'))}_{module}"
            w.step(
                f"Searching for {pattern}.",
                w.call("grep", pattern=pattern, path="src/"),
                _grep(rng, pattern, list(src.values())),
            )
        elif r < 0.62:
            path = rng.choice([src[module], tests[module]])
            old = f"def load_{module}_{rng.randint(1, 99)}(item"
            call = w.call(
                "edit_file", path=path, old_string=old, new_string=old.replace("(item", "(tenant_id: str, item")
            )
            asking = w.step(f"Adding the tenant id to {path}.", call, f"Edited {path}: 1 replacement.")
            w.probe(ARTIFACT, "edited", (path, "edit"), f"changes to {path}", asking.id, t)
        elif r < 0.68:
            if all(f"src/app/{module}_{word}.py" in w.used for word in WORDS):  # a long session
                path = w.unique(lambda module=module: f"src/app/{module}_{rng.choice(WORDS)}_{rng.randint(2, 99)}.py")
            else:
                path = w.unique(lambda module=module: f"src/app/{module}_{rng.choice(WORDS)}.py")
            call = w.call("write_file", path=path, content=_code(rng, module, rng.randint(20, 60)))
            asking = w.step(f"Creating {path} for the tenant helpers.", call, f"Created {path}.")
            w.probe(ARTIFACT, "created", (path,), f"new file {path}", asking.id, t)
        elif r < 0.86:
            command = f"python -m pytest {tests[module]} -q"
            fails = (
                []
                if rng.random() < 0.6
                else [f"{tests[module]}::test_{rng.choice(WORDS)} - AssertionError: assert 403 == 200"]
            )
            total = rng.randint(12, 60)
            asking = w.step(
                "Running the tests.", w.call("bash", command=command), _test_output(rng, module, fails, total)
            )
            outcome = "failed" if fails else "passed"
            for p in list(w.probes):  # an earlier run's outcome is superseded by this one
                if p.kind == "command" and p.needles[0] == command and p.until is None:
                    w.probes[w.probes.index(p)] = attrs.evolve(p, until=t)
            if rng.random() < 0.3:
                w.probe(ARTIFACT, "command", (command, outcome), f"result of {command}", asking.id, t)
        else:
            w.turns.append((Message.user(rng.choice(FILLER)), Message.assistant(f"Continuing with {module}.")))
        t += 1
    return Session(tuple(w.turns), tuple(w.probes))


def _value(w: _Writer, kind: str, modules: Sequence[str]) -> tuple[str, str, tuple[str, ...], str]:
    """(subject, value, needles, query) for one planted value."""
    rng = w.rng
    if kind == "port":
        subject = rng.choice(SERVICES)
        value = w.unique(lambda: rng.randint(2000, 9999) * 1 + 10000 * rng.randint(0, 4))
        return subject, value, (value,), f"which port does the {subject} use"
    if kind == "name":
        subject = rng.choice(modules)
        value = w.unique(lambda: f"{rng.choice(WORDS)}-{rng.choice(WORDS)}-{rng.randint(2, 99)}")
        return subject, value, (value,), f"what is the name of the {subject} database cluster bucket queue"
    if kind == "limit":
        subject = rng.choice(modules)
        value = w.unique(lambda: rng.randint(3, 4000))
        return subject, value, (value, subject), f"what is the limit for {subject}"
    subject = rng.choice(modules)
    pool = REQUIREMENT_VALUES if any(v not in w.used for v in REQUIREMENT_VALUES) else MORE_REQUIREMENT_VALUES
    value = w.unique(lambda: rng.choice(pool))
    return subject, value, (value,), f"what rule did the user set for {subject} {value}"


def render_call(call: ToolCall) -> str:
    """A tool call as a model sees it, one line per argument (a list of objects, one per item)."""
    lines = [f"{call.name}("]
    for key, value in dict(call.to_dict()["arguments"]).items():
        if isinstance(value, list):
            lines += [f"  {key}: {orjson.dumps(v).decode()}" for v in value]
        else:
            lines.append(f"  {key}: {orjson.dumps(value).decode()}")
    return "\n".join(lines) + ")"


__all__ = [
    "CATEGORIES",
    "HELD_OUT",
    "PHRASINGS",
    "UNSEEN_DECISIONS",
    "UNSEEN_NON_DECISIONS",
    "Probe",
    "Session",
    "generate",
    "render_call",
]
