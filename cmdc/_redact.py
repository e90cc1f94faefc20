"""What cmdc shows of a store's location: never a secret (a private helper of layer 0).

A PostgreSQL URL may carry secrets in three places libpq reads: the userinfo's password
(`user:pw@`), the parameters `password`, `passfile`, `sslpassword` and `sslkey`, and a `dbname`
that is itself a connection string. `redact_url` drops all of them; `journal_label` names a
database by its host, port and name only (a stable, secret-free label summaries can carry);
`scrub` takes the secret values out of a text that may quote them (a driver's error message).
Nothing here reads the environment: what is shown comes from the URL alone.

The URL is split as libpq splits it: the userinfo ends at the first `@` before the first `/`
(this takes the last such `@`, so a malformed URL is over-redacted, never under-redacted), the
parameters start at the first `?` after it. A parameter's name is percent-decoded before it
is compared, as libpq decodes it."""

from __future__ import annotations

import urllib.parse

SECRET_PARAMS = frozenset({"password", "passfile", "sslpassword", "sslkey"})
"""libpq connection parameters never shown."""
REDACTED = "***"
_MIN_SCRUB = 3  # shorter secret values are not searched for in texts (they would garble them)


def _split(url: str) -> tuple[str, str | None, bool, str, list[tuple[str, str, str]]] | None:
    """(scheme://, user or None, whether a password was given, host and path, parameters as
    (raw text, decoded name, decoded value)); None for a text that is not a URL."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    head, pre = rest.split("/", 1)[0], rest.split("?", 1)[0]
    user: str | None = None
    password = False
    if "@" in head or "@" in pre:  # the second: a `/` in the password (libpq fails on it; hide it)
        at = head.rfind("@") if "@" in head else pre.rfind("@")
        userinfo, rest = rest[:at], rest[at + 1 :]
        user, colon, _ = userinfo.partition(":")
        password = bool(colon)
        if "?" in user:  # libpq would read this as the user; show no part of it past the `?`
            user, password = user.split("?", 1)[0], True
    where, _, query = rest.partition("?")
    params: list[tuple[str, str, str]] = []
    for raw in query.split("&") if query else []:
        key, _, value = raw.partition("=")
        params.append((raw, urllib.parse.unquote(key).strip().lower(), urllib.parse.unquote(value)))
    return scheme + sep, user, password, where, params


def _hidden(name: str, value: str) -> bool:
    return name in SECRET_PARAMS or (name == "dbname" and ("=" in value or "://" in value))


def redact_url(url: str) -> str:
    """`url` as cmdc shows it: no userinfo password (`user:***@`), none of the secret
    parameters, no `dbname` that is a connection string; everything else as given. A text that
    is not a URL is returned as is."""
    parts = _split(url)
    if parts is None:
        return url
    scheme, user, password, where, params = parts
    path = where.split("/", 1)
    if len(path) == 2 and ("=" in urllib.parse.unquote(path[1]) or "://" in urllib.parse.unquote(path[1])):
        where = f"{path[0]}/{REDACTED}"
    kept = [raw for raw, name, value in params if not _hidden(name, value)]
    auth = "" if user is None else f"{user}:{REDACTED}@" if password else f"{user}@"
    return f"{scheme}{auth}{where}" + (f"?{'&'.join(kept)}" if kept else "")


def journal_label(url: str) -> str:
    """A PostgreSQL database as summaries and reports name it: `postgresql://HOST[:PORT]/DB`,
    from the URL's host list, port and database or their parameters; no user, no options, no
    secret. The same database reached with another password or other options has the same label."""
    parts = _split(url)
    if parts is None:
        return REDACTED
    _, _, _, where, params = parts
    named = {name: value for _, name, value in params}
    hosts, _, db = where.partition("/")
    db = urllib.parse.unquote(db)
    if "host" in named or "hostaddr" in named:
        hosts = urllib.parse.quote(named.get("host") or named.get("hostaddr", ""), safe=",")
        if "port" in named:
            hosts += ":" + urllib.parse.quote(named["port"], safe=",")
    elif "port" in named and ":" not in hosts:
        hosts += ":" + urllib.parse.quote(named["port"], safe=",")
    db = named.get("dbname", db)
    if "=" in db or "://" in db:
        db = REDACTED
    return f"postgresql://{hosts}/{db if db == REDACTED else urllib.parse.quote(db, safe='')}"


def secrets_of(url: str) -> tuple[str, ...]:
    """The secret values in `url` (as written and percent-decoded), longest first."""
    parts = _split(url)
    if parts is None:
        return ()
    found: set[str] = set()
    rest = url.partition("://")[2]
    head, pre = rest.split("/", 1)[0], rest.split("?", 1)[0]
    if parts[2]:
        userinfo = rest[: head.rfind("@") if "@" in head else pre.rfind("@")]
        found |= {userinfo.partition(":")[2], urllib.parse.unquote(userinfo.partition(":")[2]), userinfo}
    for raw, name, value in parts[4]:
        if _hidden(name, value):
            found |= {raw.partition("=")[2], value}
    return tuple(sorted((s for s in found if len(s) >= _MIN_SCRUB), key=len, reverse=True))


def scrub(text: str, url: str) -> str:
    """`text` with `url` redacted wherever it appears, and every secret value of `url` replaced
    by `***` (a driver's message may quote the connection string or one of its values)."""
    if url in text:
        text = text.replace(url, redact_url(url))
    for secret in secrets_of(url):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text
