"""Parsing and redacting Redis store URLs.

Accepted forms (the password is optional everywhere)::

    redis://[[user]:password@]host[:port][/db][?job=NAME&maxlen=N&timeout=S&rate=N]
    rediss://...                           the same over TLS: ssl_ca_certs=FILE for a private CA,
                                           ssl_certfile=FILE&ssl_keyfile=FILE for a client
                                           certificate (Redis asks for one by default),
                                           ssl_check_hostname=false to check a certificate's
                                           chain but not its names, ssl_cert_reqs=none to skip
                                           every check (redis-py's names)
    unix://[[user]:password@]/path/to/redis.sock[?db=N&job=...]

A bare ``secret@host`` is taken as a password, not a user name: AUTH needs a password,
and treating it as one means it is also redacted.  ``commscope.redact.redact`` never
raises and never returns the password, so anything that prints a store may call it
blindly; it hides the user info and the value of any query key that decodes to a
secret's name (``password``, ``pass%77ord``, ``PASSWORD`` ...).

Without a password in the URL, ``$COMMSCOPE_REDIS_PASSWORD`` is used (like redis-cli's
``REDISCLI_AUTH``), so that no password needs to appear in a command line (``ps``); so it
is for ``***``, the password as commscope shows a URL, pasted back from its output.
"""

from __future__ import annotations

import dataclasses
import os
import re
from urllib.parse import parse_qsl, unquote, unquote_plus, urlsplit

from commscope.redact import MARK, redact
from commscope.store.base import StoreError, is_job_name

SCHEMES = ("redis", "rediss", "unix")
TLS_KEYS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")
#: The largest database number Redis takes (its ``databases`` is a C int): a larger one was
#: taken by ``run`` and refused by Redis at the first read
MAX_DB = 2**31 - 1


def _whole(text: str) -> bool:
    """Whether ``text`` is a whole number in ASCII digits (``str.isdigit`` takes '²', which
    ``int`` refuses: a bad URL said no reason)."""
    return text.isascii() and text.isdigit()


QUERY_KEYS = frozenset({"job", "maxlen", "timeout", "rate", "db", "password", "username", *TLS_KEYS})
BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
ENV_PASSWORD = "COMMSCOPE_REDIS_PASSWORD"
DEFAULT_PORT = 6379
DEFAULT_TIMEOUT = 5.0
#: Appends per second a whole job may send (``?rate=``): a rank writes every
#: world_size / rate seconds (at least the recorder's tick, at most ``MAX_WRITE_EVERY``), so
#: up to 1,250 ranks write every tick (50 ms) as before and 16,384 every 0.66 s
DEFAULT_RATE = 25_000
#: The longest a rank waits between writes, whatever its job's width: a reader is never
#: further behind than this (plus its own poll)
MAX_WRITE_EVERY = 1.0


@dataclasses.dataclass(frozen=True)
class RedisTarget:
    """Where and how to connect, plus the commscope options carried in the query."""

    scheme: str
    host: str = "localhost"
    port: int = DEFAULT_PORT
    path: str | None = None  # unix socket
    db: int = 0
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    job: str | None = None
    maxlen: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    #: appends per second the whole job may send (the writers of a wide job write less often)
    rate: int = DEFAULT_RATE
    ssl_verify: bool = True
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None  # a client certificate (and its key), for mutual TLS
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True  # False: the chain is checked, not the names
    #: the password came from ``$COMMSCOPE_REDIS_PASSWORD``, not the URL (said where Redis refuses it)
    password_env: bool = dataclasses.field(default=False, repr=False, compare=False)

    @property
    def tls(self) -> bool:
        return self.scheme == "rediss"

    def display(self, *, job: str | None = None) -> str:
        """A URL naming the same store and job, password replaced by ***."""
        user = self.username or ""
        auth = f"{user}:***@" if self.password else (f"{user}@" if user else "")
        query = []
        if self.scheme == "unix":
            base = f"unix://{auth}{self.path}"
            if self.db:
                query.append(f"db={self.db}")
        else:
            host = f"[{self.host}]" if ":" in self.host else self.host
            base = f"{self.scheme}://{auth}{host}:{self.port}/{self.db}"
        job = job or self.job
        if job:
            query.append(f"job={job}")
        if self.maxlen:
            query.append(f"maxlen={self.maxlen}")
        if self.rate != DEFAULT_RATE:
            query.append(f"rate={self.rate}")
        if self.timeout != DEFAULT_TIMEOUT:
            query.append(f"timeout={self.timeout:g}")
        query += self.tls_options()
        return base + ("?" + "&".join(query) if query else "")

    def tls_options(self) -> list[str]:
        """The URL's TLS options (file paths, no secrets), so that a URL shown can be used."""
        if not self.tls:
            return []
        from urllib.parse import quote

        out = [] if self.ssl_verify else ["ssl_cert_reqs=none"]
        out += [f"{k}={quote(v)}" for k, v in (("ssl_ca_certs", self.ssl_ca_certs), ("ssl_certfile", self.ssl_certfile),
                                               ("ssl_keyfile", self.ssl_keyfile)) if v]
        return out + ([] if self.ssl_check_hostname else ["ssl_check_hostname=false"])

    def secrets(self) -> list[str]:
        """Every spelling of the password that might leak into text (raw and URL-encoded)."""
        if not self.password:
            return []
        from urllib.parse import quote

        forms = {self.password, quote(self.password, safe=""), quote(self.password)}
        return sorted((f for f in forms if f), key=len, reverse=True)

    def __repr__(self) -> str:
        return f"RedisTarget({self.display()})"


def identity(url: str) -> str:
    """Which Redis the URL names, however spelt and without credentials or options:
    ``scheme://host:port/db`` (a socket's path for a host)."""
    try:
        t = parse_url(url)
    except Exception:
        return url.split("@")[-1]
    return f"{t.scheme}://{t.path or t.host}:{t.port}/{t.db}"


def pinned_job(url: str) -> str | None:
    """The job the URL names (``?job=``), if any."""
    return parse_url(url).job


def with_job(url: str, job: str) -> str:
    """The URL naming job ``job`` of its store (``?job=``), as a reader opens it; a URL that
    names a job already is left as it is (its writers write that one)."""
    if pinned_job(url) is not None:
        return url
    return url + ("&" if "?" in url else "?") + f"job={job}"


def unpinned(url: str) -> str:
    """The URL without the job it names (``?job=``): its store, whose other jobs ``check``
    opens by ``with_job`` (a restarted run's earlier attempts)."""
    if pinned_job(url) is None:
        return url
    base, _, query = url.partition("?")
    kept = [item for item in query.split("&") if item and unquote_plus(item.partition("=")[0]) != "job"]
    return base + ("?" + "&".join(kept) if kept else "")


def password_apart(url: str) -> tuple[str, dict[str, str]]:
    """The URL without its password, and the environment that gives the password instead
    (``$COMMSCOPE_REDIS_PASSWORD``): how ``commscope run`` hands the store to the job's
    processes, so that the password is in no child's ``$COMMSCOPE_STORE`` and each child's
    redaction knows it (an environment secret is hidden wherever it is printed).  A URL
    with no password in it, or one that does not parse, is handed on as it is."""
    try:
        target = parse_url(url)
        parts = urlsplit(url)
    except Exception:
        return url, {}
    userinfo, at, hostport = parts.netloc.rpartition("@")
    pairs = [p for p in parts.query.split("&") if p]
    query = [p for p in pairs if unquote_plus(p.partition("=")[0]) != "password"]
    if not at and len(query) == len(pairs):
        return url, {}
    user, colon, _ = userinfo.partition(":")
    netloc = f"{user}:@{hostport}" if colon and user else hostport  # (``user:`` names a user; ``secret@``: a password)
    bare = f"{parts.scheme}://{netloc}{parts.path}" + (f"?{'&'.join(query)}" if query else "") + (
        f"#{parts.fragment}" if parts.fragment else "")
    return bare, ({ENV_PASSWORD: target.password} if target.password is not None else {})


def job_location(url: str, job: str) -> str:
    """A URL naming job ``job`` of the store, its password hidden."""
    return parse_url(url).display(job=job)


def scrub(text: str, target: RedisTarget | None) -> str:
    """``text`` with any spelling of the target's password replaced by ***."""
    if target is None:
        return text
    for secret in target.secrets():
        text = text.replace(secret, "***")
    return text


#: What a URL whose host is followed by an '@' is told (a password holding '/', '?' or '#')
AT_AFTER_HOST = ("an '@' after the host: percent-encode a '/', '?' or '#' in the password (%2F, %3F, %23), "
                 "or give the password in $" + ENV_PASSWORD)


#: ``user:`` with no password (given in $COMMSCOPE_REDIS_PASSWORD): an ACL user's name, kept.
_USER_ONLY = re.compile(r"[A-Za-z0-9_.~%+-]+:")


def redact_url(url: str) -> str:
    """``url`` as a message or a trace may quote it (the backend's ``redact``): redacted,
    with all before its last '@' hidden where that is not plainly user info (a password cut
    short by its unencoded '/', '?', '#' or space, a mistyped ``redis:///:pw@host``), and a
    ``?password=`` value hidden up to its '&' (a space ended it): over-hiding a bad URL is
    harmless.  The text redaction ends a URL at a space; a store's name is one URL whole."""
    text = redact(url)
    scheme, sep, rest = text.partition("://")
    head, at, tail = rest.rpartition("@")
    if sep and at and head != MARK and not head.endswith(":" + MARK) and not _USER_ONLY.fullmatch(head):
        text, rest = f"{scheme}://{MARK}@{tail}", tail
    base, q, query = text.partition("?")
    if q and " " in query:
        items = [f"{k}={MARK}" if v and v != MARK and unquote_plus(k).lower() == "password" else f"{k}{e}{v}"
                 for k, e, v in (item.partition("=") for item in query.split("&"))]
        text = f"{base}?{'&'.join(items)}"
    return text


def parse_url(url: str) -> RedisTarget:
    """Parse a store URL; raises StoreError naming the problem (never the password)."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES:
            raise StoreError(f"not a Redis URL: {shown} (expected redis://, rediss:// or unix://)")
        netloc = parts.netloc
        if ("@" in parts.path and scheme != "unix") or "@" in parts.fragment:  # (a socket's path may hold one)
            raise StoreError(f"bad Redis URL {shown}: {AT_AFTER_HOST}")
        userinfo, at, hostport = netloc.rpartition("@")
        username = password = None
        if at:
            user, colon, pw = userinfo.partition(":")
            if colon:
                username, password = unquote(user) or None, unquote(pw) or None
            else:
                password = unquote(user) or None  # redis://secret@host: see module docstring
        query: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key not in QUERY_KEYS:
                if "@" in key or "@" in value:  # (a password cut at its '?': never quoted)
                    raise StoreError(f"bad Redis URL {shown}: {AT_AFTER_HOST}")
                raise StoreError(f"unknown option {key!r} in {shown} (known: {', '.join(sorted(QUERY_KEYS))})")
            if key in query and query[key] != value:  # (?job=a&job=b recorded b and showed a, helper-197)
                raise StoreError(f"option {key!r} given twice, differently, in {shown}: give it once")
            query[key] = value
        if "password" in query:
            password = query["password"] or None
        if password == MARK:  # (a URL as commscope shows it, pasted back: its password from the environment)
            password = None
        from_env = password is None and bool(os.environ.get(ENV_PASSWORD))
        if password is None:
            password = os.environ.get(ENV_PASSWORD) or None
        if "username" in query:
            username = query["username"] or None
        fields: dict = {"scheme": scheme, "username": username, "password": password, "password_env": from_env}
        if scheme == "unix":
            path = unquote(parts.path)
            if hostport or not path:
                raise StoreError(f"bad Redis URL {shown}: expected unix:///path/to/redis.sock")
            fields["path"] = path
            db_text = query.get("db", "0")
        else:
            if not hostport:
                raise StoreError(f"bad Redis URL {shown}: no host (expected redis://host:port/db)")
            try:
                port = parts.port
            except ValueError:
                raise StoreError(f"bad Redis URL {shown}: the port is not a number in 1-65535") from None
            fields["host"] = parts.hostname or "localhost"
            fields["port"] = port or DEFAULT_PORT
            db_text = parts.path.strip("/") or query.get("db", "0")
            if parts.path.strip("/") and "db" in query and query["db"] != db_text:  # (redis-py takes ?db=, we took /N)
                raise StoreError(f"bad Redis URL {shown}: two databases (/{db_text} and db={query['db']}): give one")
        if not _whole(db_text) or int(db_text) > MAX_DB:
            raise StoreError(f"bad Redis URL {shown}: the database must be a number 0-{MAX_DB}, e.g. /0")
        fields["db"] = int(db_text)
        job = query.get("job")
        if job is not None and not is_job_name(job):
            raise StoreError(f"bad job name in {shown}: use 1-120 letters, digits, '_', '.', '-', not starting with '.'")
        fields["job"] = job
        if "maxlen" in query:
            if not _whole(query["maxlen"]) or int(query["maxlen"]) < 1:
                raise StoreError(f"bad maxlen in {shown}: a whole number of events per rank, at least 1")
            fields["maxlen"] = int(query["maxlen"])
        if "timeout" in query:
            try:
                timeout = float(query["timeout"])
            except ValueError:
                timeout = -1.0
            if not 0 < timeout <= 3600:
                raise StoreError(f"bad timeout in {shown}: seconds, greater than 0")
            fields["timeout"] = timeout
        if "rate" in query:
            if not _whole(query["rate"]) or int(query["rate"]) < 1:
                raise StoreError(f"bad rate in {shown}: appends per second for the whole job, at least 1")
            fields["rate"] = int(query["rate"])
        if "ssl_cert_reqs" in query:
            reqs = query["ssl_cert_reqs"].lower()
            if reqs not in ("none", "required"):
                raise StoreError(f"bad ssl_cert_reqs in {shown}: none or required")
            fields["ssl_verify"] = reqs == "required"
        for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            fields[key] = query.get(key) or None
        if fields["ssl_keyfile"] and not fields["ssl_certfile"]:
            raise StoreError(f"bad Redis URL {shown}: ssl_keyfile without ssl_certfile (the client certificate)")
        if "ssl_check_hostname" in query:
            check = query["ssl_check_hostname"].lower()
            if check not in BOOLS:
                raise StoreError(f"bad ssl_check_hostname in {shown}: true or false")
            fields["ssl_check_hostname"] = BOOLS[check]
        if scheme != "rediss" and any(k in query for k in TLS_KEYS):
            raise StoreError(f"TLS options in {shown}, which is not a TLS URL: use rediss://")
        return RedisTarget(**fields)
    except StoreError:
        raise
    except Exception:  # anything urlsplit may throw; its text could quote the URL
        raise StoreError(f"bad Redis URL {shown}") from None
