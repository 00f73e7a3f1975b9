"""A small RESP2 client for the Redis store: one connection, no retries, no pooling.

Why not redis-py: the reader must parse hundreds of thousands of stream entries a second
(redis-py's pure-Python parser manages ~180k/s), and the writer must control reconnects
itself (no hidden retries that would resend a batch).

``Connection.read`` parses one reply of any shape, iteratively and resumably: a reply that
arrives in pieces (a 30 MB XREAD) is parsed once, asking the socket for more only where
the bytes so far end.  ``xread``/``xrange`` parse stream entries laid out as commscope
writes them ({``FIELD``: value}) with two finds per entry, falling back to ``read`` for
any other layout or an entry split across socket reads.  Byte-level tests feed replies
split at every offset (tests/test_resp.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import ssl
import threading
import time
import weakref
from typing import Any

from commscope.store.base import StoreError
from commscope.store.redis_url import ENV_PASSWORD, RedisTarget, scrub

#: The one field of a commscope stream entry (its event).
FIELD = b"e"


class ReplyError(Exception):
    """An error reply from Redis; the connection itself is still usable."""


class RedisRefused(StoreError):
    """The server answered, and refused the connection (full, a database it lacks, a login):
    it says more than a node that did not answer (``Nodes.connect``)."""


class RedisAuthError(RedisRefused):
    """Wrong or missing password.  The message names the store with the password hidden."""


class RedisTLSRefused(RedisRefused):
    """A TLS setting of the URL that no retry mends: a server certificate its CA does not
    vouch for, or that does not name the host; a CA file, client certificate or key that
    cannot be read.  (A reset or an EOF in the handshake may be a full server, and a
    certificate not yet or no longer valid one just rotated or a clock behind: not this,
    helper-189.)"""


#: OpenSSL's verify codes of a certificate's dates (X509_V_ERR_CERT_NOT_YET_VALID,
#: X509_V_ERR_CERT_HAS_EXPIRED): the time may mend them
_DATED = frozenset({9, 10})


def _arg(a: Any) -> bytes:
    if isinstance(a, bytes):
        return a
    if isinstance(a, str):
        return a.encode()
    if isinstance(a, int):
        return b"%d" % a
    return str(a).encode()


def pack(*args: Any) -> bytes:
    """One command in RESP2."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = _arg(a)
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


_MID = b"\r\n*2\r\n$1\r\n" + FIELD + b"\r\n$"  # between an entry's id and its value
_MID_LEN = len(_MID)


class _EncryptedKey(Exception):
    pass


def _no_passphrase() -> str:
    """An encrypted client key: OpenSSL would ask for its passphrase on the terminal (and
    wait, in every rank); this refuses instead."""
    raise _EncryptedKey


class Connection:
    """One connection: send packed commands, read replies.  No retries, no pooling.

    Any OSError (refused, reset, timeout, closed) leaves the connection unusable: the
    owner closes it and decides what a retry may resend.
    """

    RECV = 1 << 20
    RECV_MAX = 64 << 20  # what one recv may ask for: a reply's claimed length is no allocation
    MAX_BULK = 512 << 20  # Redis's proto-max-bulk-len at most: a longer bulk is no Redis reply

    def __init__(self, target: RedisTarget, shown: str):
        self.t = target
        self.shown = shown
        self.sock: socket.socket | None = None
        self._buf = b""
        self._pos = 0
        #: (``time.monotonic``) no wait (connect, send, reply) lasts past it: each is cut to
        #: what is left of it, the reply timeout at most (None: the reply timeout alone)
        self.deadline: float | None = None
        self.budget = 0.0  # seconds the deadline gave when set (what a timeout then says)

    def set_timeout(self, timeout: float) -> None:
        """Wait ``timeout`` seconds for a reply from now on (the socket too, if open)."""
        self.t = dataclasses.replace(self.t, timeout=timeout)
        if self.sock is not None:
            self.sock.settimeout(timeout)

    def set_deadline(self, deadline: float | None, budget: float = 0.0) -> None:
        """No wait lasts past ``deadline`` (``time.monotonic``; None: the reply timeout
        alone again).  ``budget``: the seconds it gives, for the message of a timeout."""
        self.deadline, self.budget = deadline, budget
        sock = self.sock
        if deadline is None and sock is not None:
            with contextlib.suppress(OSError):
                sock.settimeout(self.t.timeout)

    def _wait(self) -> float:
        """How long the next wait may last: the reply timeout, cut to what is left of the
        deadline (TimeoutError when nothing is, or the thread's ``Interruptible`` was
        interrupted)."""
        scope = getattr(_scope, "current", None)
        if scope is not None:
            scope.enlist(self)
        deadline = self.deadline
        if deadline is None:
            return self.t.timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline passed")
        return min(self.t.timeout, left)

    def _ready(self, sock: socket.socket) -> None:
        wait = self._wait()
        if self.deadline is not None:
            sock.settimeout(wait)

    # -- connecting

    def connect(self) -> None:
        """Connect, log in and select the database; raises StoreError with a clear message."""
        t = self.t
        try:
            self.sock = self._socket()
            if t.password:
                self.call("AUTH", *([t.username] if t.username else []), t.password)
            if t.db:
                self.call("SELECT", t.db)
            self.call("PING")
        except ReplyError as exc:
            self.close()
            raise self._login_error(str(exc)) from None
        except ssl.SSLError as exc:
            self.close()
            refused = RedisTLSRefused if isinstance(exc, ssl.SSLCertVerificationError) and \
                getattr(exc, "verify_code", None) not in _DATED else StoreError
            raise refused(f"cannot connect to {self.shown}: {self._tls_why(exc)}") from None
        except ConnectionResetError as exc:
            self.close()
            why = self._tls_why(exc) if t.tls else \
                "connection reset while connecting (a server that speaks TLS only? use rediss://)"
            raise StoreError(f"cannot connect to {self.shown}: {why}") from None
        except OSError as exc:
            self.close()
            why = self.why(exc)
            if t.tls and isinstance(exc, TimeoutError | socket.timeout):
                why += " (or a server without TLS: then use redis://)"
            raise StoreError(f"cannot connect to {self.shown}: {why}") from None

    def _socket(self) -> socket.socket:
        t = self.t
        if t.scheme == "unix":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.settimeout(self._wait())
                s.connect(t.path)
            except BaseException:
                s.close()
                raise
            return s
        s = socket.create_connection((t.host, t.port), timeout=self._wait())
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if t.tls:
                s = self._tls_context().wrap_socket(s, server_hostname=t.host)
        except BaseException:
            s.close()
            raise
        return s

    def _tls_context(self) -> ssl.SSLContext:
        """The URL's TLS settings (redis-py's names): a private CA, a client certificate,
        the names checked or not, or nothing checked."""
        t = self.t
        try:
            ctx = ssl.create_default_context(cafile=t.ssl_ca_certs)
        except (OSError, ssl.SSLError) as exc:
            raise RedisTLSRefused(f"cannot use {self.shown}: cannot read ssl_ca_certs {t.ssl_ca_certs!r} "
                             f"({getattr(exc, 'strerror', None) or exc})") from None
        if t.ssl_certfile:
            try:
                ctx.load_cert_chain(t.ssl_certfile, t.ssl_keyfile, password=_no_passphrase)
            except _EncryptedKey:
                raise RedisTLSRefused(f"cannot use {self.shown}: the client key {t.ssl_keyfile or t.ssl_certfile!r} is "
                                 "encrypted, and commscope asks no passphrase (every rank would wait for one): "
                                 "give it a key without one (openssl pkey -in KEY -out PLAIN_KEY)") from None
            except (OSError, ssl.SSLError) as exc:
                raise RedisTLSRefused(f"cannot use {self.shown}: cannot read the client certificate "
                                 f"{t.ssl_certfile!r} (and its key: {getattr(exc, 'strerror', None) or exc})") from None
        if not t.ssl_check_hostname or not t.ssl_verify:
            ctx.check_hostname = False
        if not t.ssl_verify:
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def _tls_why(self, exc: OSError) -> str:
        """What a failed TLS handshake means, and what to add to the URL.  A server that
        wants a client certificate sends an alert and closes (TLS 1.3: after the handshake,
        at the first reply); the client reads the alert, or, when the close wins the race,
        an EOF or a reset: without a certificate given, each means the same."""
        t = self.t
        what = scrub(getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or str(exc)
                     or type(exc).__name__, t)
        if isinstance(exc, ssl.SSLCertVerificationError) and "mismatch" in what:
            return (f"the server's certificate does not name {t.host} ({what}). Connect by a name it holds; on a "
                    "Redis Cluster its certificates must name the addresses the cluster announces (IP SANs, "
                    "or cluster-preferred-endpoint-type hostname); or add ssl_check_hostname=false to check "
                    "its chain only")
        if isinstance(exc, ssl.SSLCertVerificationError) and getattr(exc, "verify_code", None) in _DATED:
            return (f"the server's certificate is not valid now ({what}): its dates against this host's clock "
                    "(a certificate just rotated, or a clock behind: retried)")
        if isinstance(exc, ssl.SSLCertVerificationError):
            return (f"the server's certificate is not trusted ({what}): add ssl_ca_certs=FILE, the "
                    "certificate authority that signed it (ssl_cert_reqs=none skips every check)")
        if not t.ssl_certfile and "CERTIFICATE_REQUIRED" in what.upper():
            return (f"TLS handshake failed ({what}): the server asks for a client certificate: add "
                    "ssl_certfile=FILE&ssl_keyfile=FILE")
        if not t.ssl_certfile and "HANDSHAKE_FAILURE" in what.upper():
            return (f"TLS handshake failed ({what}): if the server asks for a client certificate, add "
                    "ssl_certfile=FILE&ssl_keyfile=FILE")
        # (a full Redis closes before the handshake: an EOF, or, as CI at 9c78027 saw, a close
        # that reads as TLS's own, SSLZeroReturnError "TLS/SSL connection has been closed (EOF)")
        if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError | ConnectionResetError):
            full = ("a Redis full of clients closes a new one so over TLS, without a word (raise maxclients in "
                    "its config, and the open files it may use: ulimit -n)")
            if not t.ssl_certfile:
                return (f"the server closed the connection during the TLS handshake ({what}): it may ask for a "
                        f"client certificate: add ssl_certfile=FILE&ssl_keyfile=FILE; or {full}")
            return f"the server closed the connection during the TLS handshake ({what}): {full}"
        return f"TLS handshake failed ({what})"

    def _login_error(self, reply: str) -> RedisRefused:
        r = scrub(reply, self.t)
        up = r.upper()
        env = f" (the password of ${ENV_PASSWORD}: it is used for any URL without one)" if self.t.password_env else ""
        if up.startswith("WRONGPASS") or "INVALID PASSWORD" in up or "INVALID USERNAME-PASSWORD" in up:
            return RedisAuthError(f"cannot log in to {self.shown}: wrong password or user name{env}")
        if up.startswith("NOAUTH"):
            return RedisAuthError(f"cannot log in to {self.shown}: the server requires a password "
                                  f"(${ENV_PASSWORD}, or redis://:PASSWORD@host:port/db)")
        if "WITHOUT ANY PASSWORD CONFIGURED" in up:
            return RedisAuthError(f"cannot log in to {self.shown}: the server has no password set; " + (
                f"${ENV_PASSWORD} gave one (it is used for any URL without one): unset it for this store"
                if self.t.password_env else "remove it from the URL"))
        if "NOT ALLOWED IN CLUSTER MODE" in up:
            return RedisRefused(f"cannot use {self.shown}: it is a Redis Cluster node, and a cluster has only "
                              "database 0 (use /0 in the URL)")
        if "MAX NUMBER OF CLIENTS" in up:  # (``redis_keeper.full`` reads Redis's own words)
            return RedisRefused(f"cannot use {self.shown}: Redis said: {r} (it holds as many connections as its "
                              "maxclients: a wide job's ranks hold one each; raise maxclients in its config, "
                              "and the open files it may use: ulimit -n)")
        if "DB INDEX" in up:
            return RedisRefused(f"cannot use {self.shown}: no database {self.t.db} on that server")
        return RedisRefused(f"cannot use {self.shown}: Redis said: {r}")

    def why(self, exc: BaseException) -> str:
        """A short, secret-free reason for a connection failure."""
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused (is redis-server running there?)"
        if isinstance(exc, socket.gaierror):
            return f"unknown host {self.t.host!r}"
        if isinstance(exc, TimeoutError | socket.timeout):
            if self.deadline is not None and self.budget < self.t.timeout:
                return f"no answer within {self.budget:.2g} s, the time it had"
            return f"no answer within {self.t.timeout:g} s"
        if isinstance(exc, FileNotFoundError):
            return f"no socket at {self.t.path}"
        if isinstance(exc, ConnectionError) and not exc.args:
            return "connection lost"
        return scrub(getattr(exc, "strerror", None) or str(exc) or type(exc).__name__, self.t)

    # -- talking
    def send(self, data: bytes) -> None:
        if self.sock is None:
            raise ConnectionError("not connected")
        self._ready(self.sock)
        self.sock.sendall(data)

    def call(self, *args: Any) -> Any:
        """One command, one reply; an error reply raises ReplyError."""
        self.send(pack(*args))
        reply = self.read()
        if isinstance(reply, ReplyError):
            raise reply
        return reply

    def pipeline(self, commands: list[tuple]) -> list[Any]:
        """Several commands in one round trip; error replies come back as ReplyError objects."""
        self.send(b"".join(pack(*c) for c in commands))
        return [self.read() for _ in commands]

    def _more(self, buf: bytes, pos: int, need: int) -> tuple[bytes, int]:
        if self.sock is None:
            raise ConnectionError("not connected")
        self._ready(self.sock)
        chunk = self.sock.recv(min(max(self.RECV, need), self.RECV_MAX))
        if not chunk:
            raise ConnectionError("Redis closed the connection")
        return buf[pos:] + chunk, 0

    def read(self) -> Any:
        """One reply.  Iterative and resumable, so a 30 MB XREAD reply arriving in pieces
        is parsed once, and each element costs a find, a slice and an append."""
        buf, pos = self._buf, self._pos
        stack: list[list] = []  # [items, expected length]
        try:
            while True:
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    buf, pos = self._more(buf, pos, 0)
                    continue
                kind = buf[pos]
                if kind == 36:  # $ bulk string
                    n = int(buf[pos + 1:nl])
                    if n > self.MAX_BULK:
                        raise ConnectionError(f"protocol error: a bulk string of {n} bytes from Redis")
                    if n < 0:
                        val: Any = None
                        pos = nl + 2
                    else:
                        end = nl + 2 + n
                        if end + 2 > len(buf):
                            buf, pos = self._more(buf, pos, end + 2 - pos)
                            continue
                        val = buf[nl + 2:end]
                        pos = end + 2
                elif kind == 42:  # * array
                    n = int(buf[pos + 1:nl])
                    pos = nl + 2
                    if n > 0:
                        stack.append([[], n])
                        continue
                    val = None if n < 0 else []
                elif kind == 58:  # : integer
                    val = int(buf[pos + 1:nl])
                    pos = nl + 2
                elif kind == 43:  # + simple string
                    val = buf[pos + 1:nl]
                    pos = nl + 2
                elif kind == 45:  # - error
                    val = ReplyError(buf[pos + 1:nl].decode("utf-8", "replace"))
                    pos = nl + 2
                else:
                    raise ConnectionError(f"protocol error: unexpected byte {kind!r} from Redis")
                while stack:
                    top = stack[-1]
                    top[0].append(val)
                    if len(top[0]) < top[1]:
                        break
                    val = stack.pop()[0]
                else:
                    self._buf, self._pos = buf, pos
                    if pos > (1 << 16) and pos * 2 > len(buf):
                        self._buf, self._pos = buf[pos:], 0
                    return val
        except (ValueError, IndexError) as exc:  # a number that is none: not a Redis reply
            self.close()
            raise ConnectionError(f"protocol error: {exc} in a reply from Redis") from None
        except BaseException:
            self.close()  # a half-read reply poisons the stream
            raise

    # -- stream replies: the reader's hot path
    def _header(self) -> tuple[int, int]:
        """The next reply line as (type byte, its number): '*' and '$' lengths, ':' ints."""
        buf, pos = self._buf, self._pos
        while True:
            nl = buf.find(b"\r\n", pos)
            if nl >= 0:
                break
            buf, pos = self._more(buf, pos, 0)
        kind = buf[pos]
        self._buf, self._pos = buf, nl + 2
        if kind == 45:
            raise ReplyError(buf[pos + 1:nl].decode("utf-8", "replace"))
        if kind not in (42, 36, 58):
            raise ConnectionError(f"protocol error: unexpected reply {buf[pos:nl][:40]!r} from Redis")
        try:
            n = int(buf[pos + 1:nl])
        except ValueError:
            raise ConnectionError(f"protocol error: unexpected reply {buf[pos:nl][:40]!r} from Redis") from None
        if kind == 36 and n > self.MAX_BULK:
            raise ConnectionError(f"protocol error: a bulk string of {n} bytes from Redis")
        return kind, n

    def _bulk(self) -> bytes:
        kind, n = self._header()
        if kind != 36 or n < 0:
            raise ConnectionError("protocol error: expected a bulk string from Redis")
        while self._pos + n + 2 > len(self._buf):
            self._buf, self._pos = self._more(self._buf, self._pos, self._pos + n + 2 - len(self._buf))
        val = self._buf[self._pos:self._pos + n]
        self._pos += n + 2
        return val

    def _entries(self, n: int) -> list[tuple[bytes, bytes | None]]:
        """``n`` stream entries as (id, value of field ``e``); value None when the entry
        is not exactly {e: value}.  Reads the layout commscope writes with two finds per
        entry; anything else (or a reply split across reads) goes through ``read``."""
        out: list[tuple[bytes, bytes | None]] = []
        append = out.append
        buf, pos = self._buf, self._pos
        find, startswith = buf.find, buf.startswith
        size = len(buf)
        i = 0
        while i < n:
            if startswith(b"*2\r\n$", pos):
                nl = find(b"\r\n", pos + 5)
                if nl > 0:
                    s = nl + 2
                    e = s + int(buf[pos + 5:nl])
                    if startswith(_MID, e):
                        nl = find(b"\r\n", e + _MID_LEN)
                        if nl > 0:
                            vs = nl + 2
                            ve = vs + int(buf[e + _MID_LEN:nl])
                            if ve + 2 <= size:
                                append((buf[s:e], buf[vs:ve]))
                                pos = ve + 2
                                i += 1
                                continue
            self._buf, self._pos = buf, pos  # slow path for this one entry
            entry = self.read()
            if isinstance(entry, ReplyError):
                raise entry
            fields = entry[1] if isinstance(entry, list) and len(entry) == 2 else None
            value = fields[1] if isinstance(fields, list) and len(fields) == 2 and fields[0] == FIELD else None
            append((entry[0], value))
            i += 1
            buf, pos = self._buf, self._pos
            find, startswith = buf.find, buf.startswith
            size = len(buf)
        self._buf, self._pos = buf, pos
        return out

    def xrange(self, *args: Any) -> list[tuple[bytes, bytes | None]]:
        """XRANGE/XREVRANGE with the fast entry parser."""
        self.send(pack(*args))
        return self.read_entries()

    def read_entries(self) -> list[tuple[bytes, bytes | None]]:
        """The reply of an XRANGE/XREVRANGE sent before, with the fast entry parser; an
        error reply raises ReplyError (the connection stays usable)."""
        try:
            kind, n = self._header()
            if kind != 42:
                raise ConnectionError("protocol error: XRANGE reply is not an array")
            return self._entries(n) if n > 0 else []
        except ReplyError:
            raise  # a whole error line was consumed: the connection is fine
        except (ValueError, IndexError, TypeError) as exc:  # (the fast path's numbers, an entry's layout)
            self.close()
            raise ConnectionError(f"protocol error: {exc} in a reply from Redis") from None
        except BaseException:
            self.close()
            raise

    def xread(self, *args: Any) -> list[tuple[bytes, list[tuple[bytes, bytes | None]]]]:
        """XREAD with the fast entry parser: [(key, entries)] ([] when nothing is new)."""
        self.send(pack(*args))
        return self.read_streams()

    def read_streams(self) -> list[tuple[bytes, list[tuple[bytes, bytes | None]]]]:
        """The reply of an XREAD sent before, with the fast entry parser; an error reply
        raises ReplyError (the connection stays usable)."""
        try:
            kind, n = self._header()
            if kind != 42:
                raise ConnectionError("protocol error: XREAD reply is not an array")
            out = []
            for _ in range(max(n, 0)):
                kind, two = self._header()
                if kind != 42 or two != 2:
                    raise ConnectionError("protocol error: unexpected XREAD reply layout")
                key = self._bulk()
                kind, m = self._header()
                out.append((key, self._entries(m) if kind == 42 and m > 0 else []))
            return out
        except ReplyError:
            raise
        except (ValueError, IndexError, TypeError) as exc:  # (the fast path's numbers, an entry's layout)
            self.close()
            raise ConnectionError(f"protocol error: {exc} in a reply from Redis") from None
        except BaseException:
            self.close()
            raise

    def interrupt(self) -> None:
        """From another thread (``Interruptible.interrupt``): the wait in progress ends now
        with an OSError; the owner closes the connection as after any."""
        sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        sock, self.sock = self.sock, None
        self._buf, self._pos = b"", 0
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()


_scope = threading.local()


class Interruptible:
    """The store I/O of one thread, which another thread may cut short.

    Every connection the thread waits on inside ``with scope:`` (connecting, sending,
    reading a reply) is enlisted; ``interrupt()`` ends the wait in progress at once and makes
    every later one raise at once (TimeoutError, an OSError: the owner reacts as to a lost
    connection, and counts nothing it did not store as stored), until ``resume()``.  The
    recorder thread runs in one, so that whoever waits for its tick never waits for a
    store that does not answer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: weakref.WeakSet[Connection] = weakref.WeakSet()
        self.cut = False

    def __enter__(self) -> Interruptible:
        _scope.current = self
        return self

    def __exit__(self, *exc: object) -> None:
        _scope.current = None

    def enlist(self, conn: Connection) -> None:
        """``conn`` is about to wait (TimeoutError if interrupted)."""
        with self._lock:
            if self.cut:
                raise TimeoutError("interrupted")
            self._conns.add(conn)

    def interrupt(self) -> None:
        with self._lock:
            self.cut = True
            conns = list(self._conns)
        for conn in conns:
            conn.interrupt()

    def resume(self) -> None:
        with self._lock:
            self.cut = False
            self._conns = weakref.WeakSet()
