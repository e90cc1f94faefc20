"""The PostgreSQL store's dealings with its driver (psycopg 3 and its pool): which errors mean
a lost connection or a transaction worth trying again, and the driver's own log records passed
on without the URLs' secrets (`cmdc._redact`)."""

from __future__ import annotations

import logging
import threading

import psycopg
import psycopg_pool

from ..._redact import REDACTED, redact_url, secrets_of

_RETRIED_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})
"""Server errors retried as a lost connection is: the server shutting down or starting, too
many connections. Every other server error (a limit, a data error) is deterministic."""


def connection_lost(exc: BaseException) -> bool:
    """Whether `exc` means the connection (or the server) went away, so that the same operation
    may well succeed on a new connection: a pool that found none, a client-side
    `OperationalError` (no SQLSTATE), a connection-class (08) state or one of `_RETRIED_STATES`.
    A deterministic error (`program_limit_exceeded`, a data error...) is not."""
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _RETRIED_STATES


def retryable(exc: BaseException) -> bool:
    """Whether the same operation may well succeed if tried again: a lost connection
    (`connection_lost`), or a transaction the server rolled back for its own reasons (a
    serialization failure, a deadlock: SQLSTATE class 40). Every operation is idempotent."""
    return connection_lost(exc) or (isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith("40"))


_SECRETS: tuple[str, ...] = ()
"""The secret values of every store URL this process made a store for (`cmdc._redact`), longest
first: taken out of the driver's log records, which do not know which store they concern.
Replaced whole (under `_SECRETS_LOCK`), so the driver's threads read it without a lock."""
_SECRETS_LOCK = threading.Lock()


def _remember_secrets(url: str) -> None:
    global _SECRETS
    found = secrets_of(url)
    if found and not set(found) <= set(_SECRETS):
        with _SECRETS_LOCK:
            _SECRETS = tuple(sorted(set(_SECRETS) | set(found), key=len, reverse=True))


class _DriverLog(logging.Handler):
    """psycopg's and psycopg_pool's log records ("error connecting in 'pool-1'", "discarding
    closed connection"), passed on to the logger `cmdc.postgres.driver` without the URLs'
    secrets. With no logging configured, Python prints a library's warnings to stderr; through
    cmdc's logger (a `NullHandler`) nothing is printed unless the application asked for logs."""

    target = logging.getLogger("cmdc.postgres.driver")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if not self.target.isEnabledFor(record.levelno):
                return
            text = record.getMessage()
            for secret in _SECRETS:
                text = text.replace(secret, REDACTED)
            self.target.log(record.levelno, "%s: %s", record.name, text)
        except Exception:  # logging never breaks the store
            return


def _quiet_driver() -> None:
    """Route the driver's loggers through `_DriverLog`, unless the application gave the
    `psycopg` logger handlers of its own (then its set-up is kept as it is)."""
    driver = logging.getLogger("psycopg")
    if driver.handlers:
        return
    driver.addHandler(_DriverLog())
    driver.propagate = False


_quiet_driver()


def is_postgres_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))


def redact(url: str) -> str:
    """The URL without its secrets, for messages and reprs (`cmdc._redact.redact_url`)."""
    return redact_url(url)
