"""The RESP client's parsers, byte by byte: every reply split at every offset parses the same.

A live server hands replies over in whatever pieces the socket delivers; these tests
deliver them in every possible two-piece split (and one byte at a time), without a server.
"""

from __future__ import annotations

import pytest

from commscope.store.redis_store import Keys
from commscope.store.redis_url import parse_url
from commscope.store.resp import FIELD, Connection, ReplyError, pack


class Err(str):
    """An error reply in ``resp()``."""


class Simple(bytes):
    """A simple-string reply in ``resp()`` (parsed as bytes)."""


def resp(v) -> bytes:
    """A value as RESP2 bytes: bytes -> bulk, None -> null bulk, int, list -> array, Err -> error,
    Simple -> simple string."""
    if isinstance(v, Err):
        return b"-" + v.encode() + b"\r\n"
    if isinstance(v, Simple):
        return b"+" + v + b"\r\n"
    if v is None:
        return b"$-1\r\n"
    if isinstance(v, bytes):
        return b"$%d\r\n%s\r\n" % (len(v), v)
    if isinstance(v, int):
        return b":%d\r\n" % v
    return b"*%d\r\n" % len(v) + b"".join(resp(x) for x in v)


class FakeSocket:
    """Hands out the given pieces, one per recv; records what was sent."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = [p for p in pieces if p]
        self.sent = b""

    def recv(self, n: int) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""

    def sendall(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        pass


def conn_over(pieces: list[bytes]) -> Connection:
    c = Connection(parse_url("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0")
    c.sock = FakeSocket(pieces)
    return c


def splits(data: bytes):
    """Every way to deliver ``data``: whole, in two pieces at each offset, a byte at a time."""
    yield [data]
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]
    yield [data[i:i + 1] for i in range(len(data))]


def entry(k: int, value: bytes):
    return [b"0-%d" % k, [FIELD, value]]


# An XREAD reply for two streams: commscope's layout, an empty value, a value holding CRLF
# and RESP-looking bytes, and one entry in a foreign layout (two fields: value None).
RANK0, RANK1 = Keys.stream("j", 0).encode(), Keys.stream("j", 1).encode()
XREAD = [[RANK0, [entry(1, b'{"type":"op","id":1}'), entry(2, b""),
                  entry(3, b"a\r\n*2\r\n$1\r\ne\r\n$"), [b"5-0", [b"x", b"1", b"e", b"2"]]]],
         [RANK1, [entry(1, b'{"id":7}')]]]
XREAD_PARSED = [(RANK0, [(b"0-1", b'{"type":"op","id":1}'), (b"0-2", b""),
                          (b"0-3", b"a\r\n*2\r\n$1\r\ne\r\n$"), (b"5-0", None)]),
                (RANK1, [(b"0-1", b'{"id":7}')])]


def test_pack_is_resp2():
    assert pack("XREAD", "COUNT", 10, b"k") == b"*4\r\n$5\r\nXREAD\r\n$5\r\nCOUNT\r\n$2\r\n10\r\n$1\r\nk\r\n"


def test_read_parses_every_reply_type_at_every_split():
    value = [b"bulk", None, 42, -7, Simple(b"OK"), [], [[b"x"], [b"", 0]], b"with\r\ncrlf", None]
    data = resp(value) + resp(b"next")  # a second reply right behind: must stay for the next read
    for pieces in splits(data):
        c = conn_over(pieces)
        assert c.read() == value
        assert c.read() == b"next"


def test_null_array_and_error_replies():
    for pieces in splits(b"*-1\r\n" + resp(Err("WRONGTYPE Operation against a key")) + resp(1)):
        c = conn_over(pieces)
        assert c.read() is None
        err = c.read()
        assert isinstance(err, ReplyError) and str(err).startswith("WRONGTYPE")
        assert c.read() == 1  # an error reply leaves the connection usable


def test_call_raises_error_replies_and_pipeline_returns_them():
    c = conn_over([resp(Err("ERR unknown command")), resp(Simple(b"PONG"))])
    with pytest.raises(ReplyError):
        c.call("NOPE")
    assert c.call("PING") == b"PONG"
    c = conn_over([resp(3) + resp(Err("ERR x")) + resp(b"v")])
    got = c.pipeline([("XLEN", "a"), ("BAD",), ("GET", "b")])
    assert got[0] == 3 and isinstance(got[1], ReplyError) and got[2] == b"v"
    assert c.sock.sent == pack("XLEN", "a") + pack("BAD") + pack("GET", "b")


def test_xread_fast_parser_at_every_split():
    data = resp(XREAD)
    for pieces in splits(data):
        assert conn_over(pieces).xread("XREAD", "STREAMS", "a", "0") == XREAD_PARSED


def test_xread_with_nothing_new():
    for reply in (b"*-1\r\n", b"*0\r\n"):
        for pieces in splits(reply):
            assert conn_over(pieces).xread("XREAD", "STREAMS", "a", "0") == []


def test_xrange_fast_parser_at_every_split_and_then_the_next_reply():
    entries = XREAD[0][1]
    data = resp(entries) + resp(b"after")
    for pieces in splits(data):
        c = conn_over(pieces)
        assert c.xrange("XRANGE", "a", "-", "+") == XREAD_PARSED[0][1]
        assert c.read() == b"after"


def test_xrange_error_reply_keeps_the_connection():
    c = conn_over([resp(Err("ERR no such key")), resp([entry(1, b"x")])])
    with pytest.raises(ReplyError):
        c.xrange("XRANGE", "a", "-", "+")
    assert c.sock is not None and c.xrange("XRANGE", "a", "-", "+") == [(b"0-1", b"x")]


@pytest.mark.parametrize("data", [b"!bad\r\n", b"*1\r\n$5\r\nab", b""])
def test_garbage_or_a_cut_reply_closes_the_connection(data):
    c = conn_over([data])
    with pytest.raises(ConnectionError):
        c.read()
    assert c.sock is None  # a half-read reply poisons the stream: never reused


class SizedSocket(FakeSocket):
    """Records the sizes asked of recv (what a reader would allocate)."""

    def __init__(self, pieces: list[bytes]):
        super().__init__(pieces)
        self.asked: list[int] = []

    def recv(self, n: int) -> bytes:
        self.asked.append(n)
        return super().recv(n)


@pytest.mark.parametrize("reply", [
    b"$99999999999\r\nxx",  # a bulk length no Redis sends (proto-max-bulk-len is 512 MB at most)
    b"$abc\r\n", b":12x\r\n", b"*zz\r\n", b"*2\r\n$q\r\n",  # numbers that are not numbers
])
@pytest.mark.parametrize("how", ["read", "read_entries", "read_streams"])
def test_a_reply_no_redis_sends_is_a_protocol_error_not_a_crash(reply, how):
    """Readers trust nothing: a server that is not Redis (or a damaged one) makes a
    ConnectionError (an OSError: "cannot read ...", exit 2), never a MemoryError from a
    length it claims, nor a ValueError or a traceback."""
    c = conn_over([])
    c.sock = sock = SizedSocket([reply])
    with pytest.raises(ConnectionError, match="protocol error"):
        getattr(c, how)()
    assert all(n <= 64 << 20 for n in sock.asked)


def test_a_cluster_slots_reply_no_redis_sends_is_a_protocol_error():
    from commscope.store.cluster import Nodes

    t = parse_url("redis://127.0.0.1:6379/0")
    for reply in (b":7\r\n", b"*1\r\n*3\r\n:0\r\n:999999999\r\n*2\r\n$9\r\n127.0.0.1\r\n:1\r\n",
                  b"*1\r\n*2\r\n:0\r\n:5\r\n", b"*1\r\n$3\r\nabc\r\n"):
        c = conn_over([reply])
        with pytest.raises(ConnectionError, match="protocol error"):
            Nodes(t, "x")._read_map(c, ("127.0.0.1", 6379))
