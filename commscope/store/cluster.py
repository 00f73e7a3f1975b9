"""Which Redis node serves a key: one Redis, or a Redis Cluster, seen as one keyspace.

A Redis Cluster splits its keys over 16,384 hash slots (CRC16 of the key, or of its hash
tag: the part between the first ``{`` and the next ``}``), each served by one master.
``Nodes`` asks the node the URL names for the slot map, keeps one connection per master
it talks to, sends each command to the node of its key, and follows the cluster:

- ``MOVED slot host:port``: the slot is served elsewhere (a resharding, a failover).  The
  slot map is read again (``CLUSTER SLOTS``) and the command sent there.
- ``ASK slot host:port``: the slot is being migrated and this key is already on the
  target: ``ASKING``, then the command, there (the map is not changed).
- ``TRYAGAIN``: a multi-key command during a migration; sent again a moment later.

A node that answers MOVED, ASK or TRYAGAIN ran nothing, so following them never runs a
command twice; the writer's append script relies on it.  A single Redis answers the map's
question with an error and never redirects: a cluster of one node, so the store has one
code path for both.  A node that cannot be reached is an ``OSError`` for the caller, as on
one Redis (it owns what a retry may resend); the next ``connect`` reads the map again from
any node it knew (replicas included), so a failover is followed.

Commands for many keys (a poll's XREADs, a count's XLENs) go out together: each node's in
one write, then the replies read node by node, so a poll costs one round trip per node,
not one per key.
"""

from __future__ import annotations

import binascii
import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from commscope.store.base import StoreError
from commscope.store.redis_url import RedisTarget
from commscope.store.resp import Connection, RedisRefused, ReplyError, pack

SLOTS = 16384
#: Redis's ``maxclients`` where it will not say (an ACL without INFO or CONFIG): its default
DEFAULT_MAXCLIENTS = 10_000
T = TypeVar("T")
Address = tuple[str, int]


def keyslot(key: bytes | str) -> int:
    """The hash slot of ``key``, as Redis Cluster computes it (CRC16/XMODEM, hash tags)."""
    k = key.encode() if isinstance(key, str) else key
    start = k.find(b"{")
    if start >= 0:
        end = k.find(b"}", start + 1)
        if end > start + 1:
            k = k[start + 1:end]
    return binascii.crc_hqx(k, 0) % SLOTS


@dataclasses.dataclass(frozen=True)
class Clients:
    """What a Redis node says of its clients (``Nodes.clients``)."""

    connected: int | None  # the clients connected now, its cluster bus links too (None: it will not say)
    most: int  # its ``maxclients``
    said: bool = True  # False: ``most`` is Redis's default, assumed where it would not say


def _redirect(exc: ReplyError, sender: Address) -> tuple[str, Address] | None:
    """("MOVED" or "ASK", the node's address) of a redirection error; None for another.  An
    empty host ("MOVED 14415 :7001", ``cluster-preferred-endpoint-type unknown-endpoint``)
    is the host of the node that sent it."""
    words = str(exc).split()
    if len(words) == 3 and words[0] in ("MOVED", "ASK"):
        host, _, port = words[2].rpartition(":")
        host = host.strip("[]")
        if port.isdigit():
            return words[0], (sender[0] if host in ("", "?") else host, int(port))
    return None


def _redirected(reply: Any) -> bool:
    return isinstance(reply, ReplyError) and str(reply).split(" ", 1)[0] in ("MOVED", "ASK", "TRYAGAIN")


class Nodes:
    """The nodes of one store: every key's connection, redirections followed.

    ``connect`` connects to the URL's node and asks whether it is a cluster (``CLUSTER
    SLOTS``): then the slot map, and every master and replica, are known, so a writer whose
    node fails over finds the replica that took over.  An ACL user that may not read the
    map learns each slot from its first MOVED.  ``reset`` closes every connection but
    remembers the nodes, so the next ``connect`` asks another one when the first is gone.
    Any failure while replies are pending closes every connection (``reset``): a reply
    left unread would be taken for the next command's.
    """

    #: redirections followed for one command before giving up (a map that keeps moving)
    MAX_REDIRECTS = 8
    #: slots learnt one at a time from MOVED (an ACL user that may not read the map)
    _learning = False
    _single = False  # (a Redis that said it is no cluster: ``learning`` has nothing to learn)

    def __init__(self, target: RedisTarget, shown: str):
        self.target = target
        self.shown = shown
        self.cluster = False
        self._slots: list[Address] = []
        #: bumped whenever the slot map changes (read again, a slot learnt): a follower looks at
        #: the masters only when it moved (``RedisReader._settling``); ``masters`` per version
        self.version = 0
        self._masters: tuple[int, list[Address]] = (-1, [])
        self._conns: dict[Address, Connection] = {}
        self._known: list[Address] = [(target.host, target.port)]
        self._deadline: tuple[float | None, float] = (None, 0.0)  # (``Connection.set_deadline``'s)

    def known(self) -> list[Address]:
        """Every node this client has learnt of (the URL's first)."""
        return list(self._known)

    def know(self, addresses: Sequence[Address]) -> None:
        """Nodes to ask too when the URL's node does not answer (another client's ``known``)."""
        self._known.extend(a for a in addresses if a not in self._known)

    # -- the map
    def connect(self) -> None:
        """Connect to the URL's node (or, after a failure, any node known) and read the
        slot map where it is a cluster.  StoreError when none answers: the first node's
        error, or the first refusal where a node refused (full, say) after one that did not
        answer (the URL's node down, the others full said only "connection refused", and a
        keeper never read them as full)."""
        error: StoreError | None = None
        for address in list(self._known):
            try:
                conn = self._conn(address)
                self._ask_map(conn, address)
                return
            except StoreError as exc:
                dropped = self._conns.pop(address, None)  # (a node that left the cluster: ask the next)
                if dropped is not None:
                    dropped.close()
                if error is None or (isinstance(exc, RedisRefused) and not isinstance(error, RedisRefused)):
                    error = exc
            except OSError as exc:
                self.reset()
                error = error or StoreError(f"cannot connect to {self.shown}: {self.why(exc)}")
        raise error or StoreError(f"cannot connect to {self.shown}")

    def _ask_map(self, conn: Connection, address: Address) -> None:
        """The slot map from ``address``: every slot there for one Redis, and for an ACL
        user that may not read it (learnt from MOVED)."""
        if self.target.scheme == "unix":
            self._slots = [address]
            self.version += 1
            return
        try:
            self._read_map(conn, address)
        except ReplyError as exc:
            self._slots = [address] * SLOTS if self.cluster else [address]
            self.version += 1
            self._learning = True
            self._single = "cluster support disabled" in str(exc)  # (one Redis, as it says: nothing to learn)

    def _read_map(self, conn: Connection, asked: Address) -> None:
        """The slot map from ``asked`` (ReplyError where it is not a cluster, or will not say)."""
        reply = conn.call("CLUSTER", "SLOTS")
        slots: list[Address] = [asked] * SLOTS
        if reply is not None and not isinstance(reply, list):
            raise ConnectionError(f"protocol error: a CLUSTER SLOTS reply that is no array ({reply!r:.40})")
        if not reply and any(a != asked for a in self._known):
            # a node that serves and knows no slot (it left the cluster) while others are known:
            # no map to take from it (taken, every key went to it, CLUSTERDOWN for ever)
            raise StoreError(f"cannot use {self.shown}: the cluster node {asked[0]}:{asked[1]} knows no slots "
                             "(it left its cluster, e.g. redis-cli --cluster del-node, or its cluster was never "
                             "created): name a node of the cluster")
        for row in reply or []:
            try:  # (a reply no Redis sends: not trusted, never a slot range past the map)
                lo, hi = int(row[0]), int(row[1])
                nodes = []
                for node in row[2:]:  # the master, then its replicas (a failover promotes one)
                    host = node[0].decode() if node[0] else ""
                    nodes.append((asked[0] if host in ("", "?") else host, int(node[1])))
                if not (0 <= lo <= hi < SLOTS and nodes):
                    raise ValueError(f"slots {lo}-{hi} with {len(nodes)} node(s)")
            except (TypeError, ValueError, IndexError, AttributeError, UnicodeDecodeError) as exc:
                raise ConnectionError(f"protocol error: an unexpected CLUSTER SLOTS reply ({exc})") from None
            slots[lo:hi + 1] = [nodes[0]] * (hi - lo + 1)
            self._known.extend(a for a in nodes if a not in self._known)
        self.cluster = True
        self._slots = slots
        self.version += 1

    def node(self, key: bytes | str) -> Address:
        """The address of the node serving ``key``."""
        return self._slots[keyslot(key)] if self.cluster else self._slots[0]

    @property
    def learning(self) -> bool:
        """Whether the slot map is being learnt from redirections (an ACL user that may not
        read it): which node serves a slot is not known until a key there was asked.
        Never for one Redis that said it is one."""
        return self._learning and not self._single

    def masters(self) -> list[Address]:
        """Every node known to serve slots (one, for a single Redis)."""
        if self._masters[0] != self.version:
            self._masters = (self.version, sorted(set(self._slots)))
        return list(self._masters[1])

    # -- connections
    def _conn(self, address: Address) -> Connection:
        conn = self._conns.get(address)
        if conn is None or conn.sock is None:
            target = self.target if address == (self.target.host, self.target.port) else \
                dataclasses.replace(self.target, host=address[0], port=address[1], db=0)
            conn = Connection(target, self.shown if target is self.target else
                              f"{self.shown} (cluster node {address[0]}:{address[1]})")
            conn.set_deadline(*self._deadline)
            conn.connect()
            self._conns[address] = conn
        return conn

    def conn(self, key: bytes | str) -> Connection:
        """The connection to the node serving ``key`` (connected now if need be)."""
        return self._conn(self.node(key))

    def clients(self, key: bytes | str) -> Clients:
        """What the node of ``key`` says of its clients (``INFO clients``, Redis 7; its
        ``maxclients`` by ``CONFIG GET`` before, and the clients connected not known;
        ``DEFAULT_MAXCLIENTS`` where it says neither).  OSError or StoreError where it cannot
        be reached."""
        connected: int | None = None
        with contextlib.suppress(ReplyError, ValueError):
            info = self.call(key, "INFO", "clients")
            said = dict(line.split(b":", 1) for line in info.splitlines() if b":" in line) \
                if isinstance(info, bytes) else {}
            if b"connected_clients" in said:  # (a cluster's bus links count against maxclients too)
                connected = int(said[b"connected_clients"]) + int(said.get(b"cluster_connections", 0))
            if b"maxclients" in said:
                return Clients(connected, int(said[b"maxclients"]))
        with contextlib.suppress(ReplyError, ValueError, TypeError):
            reply = self.call(key, "CONFIG", "GET", "maxclients")
            if isinstance(reply, list) and len(reply) == 2:
                return Clients(connected, int(reply[1]))
        return Clients(connected, DEFAULT_MAXCLIENTS, said=False)

    def each_master(self, *args: Any) -> dict[Address, Any]:
        """One command on every node serving slots (one, for a single Redis): its reply by
        node; a node that refuses it or cannot be reached is left out."""
        out: dict[Address, Any] = {}
        for address in self.masters():
            try:
                out[address] = self._conn(address).call(*args)
            except (OSError, ReplyError, StoreError):
                continue
        return out

    def keep_only(self, *keys: bytes | str) -> None:
        """Close the connections to every node but those of ``keys``: a writer appends to one
        stream (a keeper of keyframes reads its process's), and 16k ranks each holding a
        connection to every master would pass Redis's ``maxclients``."""
        keep = {self.node(key) for key in keys}
        for address in [a for a in self._conns if a not in keep]:
            self._conns.pop(address).close()

    def set_timeout(self, timeout: float) -> None:
        """Wait ``timeout`` seconds for a reply from now on, on the open connections too."""
        self.target = dataclasses.replace(self.target, timeout=timeout)
        for conn in self._conns.values():
            conn.set_timeout(timeout)

    def set_deadline(self, deadline: float | None) -> None:
        """No wait on any node lasts past ``deadline`` (``time.monotonic``), from now on and
        on the open connections too (None: each reply's timeout alone again)."""
        self._deadline = (deadline, 0.0 if deadline is None else max(0.0, deadline - time.monotonic()))
        for conn in list(self._conns.values()):
            conn.set_deadline(*self._deadline)

    def why(self, exc: BaseException) -> str:
        """A short, secret-free reason for a connection failure."""
        conn = Connection(self.target, self.shown)
        conn.set_deadline(*self._deadline)
        return conn.why(exc)

    def reset(self) -> None:
        """Close every connection (after a failure: the next use connects again)."""
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    close = reset

    # -- commands
    def run(self, key: bytes | str, command: bytes, read: Callable[[Connection], T] | None = None) -> T:
        """Send a packed ``command`` on ``key`` to its node and ``read`` its reply (None:
        ``Connection.read``), following redirections.  An error reply is returned
        (``Connection.read``) or raised (the stream readers) as the reader does; OSError or
        StoreError when a node cannot be reached (every connection closed then)."""
        asking: Address | None = None
        try:
            for _attempt in range(self.MAX_REDIRECTS + 1):
                sender = asking if asking is not None else self.node(key)
                conn = self._conn(sender)
                if asking is not None:
                    conn.send(pack("ASKING") + command)
                    asked = conn.read()
                else:
                    conn.send(command)
                    asked = None
                try:
                    reply = conn.read() if read is None else read(conn)
                    raised = False
                except ReplyError as exc:
                    reply, raised = exc, True  # type: ignore[assignment]
                if isinstance(asked, ReplyError):
                    raise asked  # (both replies read: the connection stays in step)
                if asking is None and self._unserved(reply, sender, key):
                    continue  # (learning the map: a node that serves no slot, asked again elsewhere)
                if _redirected(reply):
                    moved = _redirect(reply, sender)  # type: ignore[arg-type]
                    if moved is not None:
                        asking = self._follow(moved, key)
                    else:  # TRYAGAIN: a multi-key command in a slot being migrated
                        time.sleep(0.05)
                        asking = None
                    continue
                if raised:
                    raise reply  # type: ignore[misc]
                return reply
        except ReplyError:
            raise
        except BaseException:
            self.reset()
            raise
        raise StoreError(f"cannot use {self.shown}: the cluster kept redirecting key {key!r}")

    def _unserved(self, reply: Any, sender: Address, key: bytes | str) -> bool:
        """Whether ``reply`` is a node's "CLUSTERDOWN Hash slot not served" while this client
        learns the map from MOVED: a node that left its cluster (reset, serving nothing) says so
        for every key, where a node of the cluster redirects.  Then the key's slot is sent to the
        next known node that can be reached (True); it answers, or redirects.  Before, a writer
        whose URL named such a node took it for the node of every slot on every reconnect."""
        if not (self._learning and isinstance(reply, ReplyError)
                and str(reply).startswith("CLUSTERDOWN Hash slot not served")):
            return False
        known = self._known
        at = known.index(sender) if sender in known else -1
        for address in known[at + 1:] + known[:at + 1]:
            if address == sender:
                return False  # (no other node answers: the reply stands)
            try:
                self._conn(address)
            except (OSError, StoreError):
                dropped = self._conns.pop(address, None)
                if dropped is not None:
                    dropped.close()
                continue
            self._slots[keyslot(key)] = address
            self.version += 1
            return True
        return False

    def _follow(self, moved: tuple[str, Address], key: bytes | str) -> Address | None:
        """Where to send again after a redirection: None (the map read again, or this slot
        learnt) for MOVED, the target for ASK."""
        kind, address = moved
        if address not in self._known:
            self._known.append(address)
        if kind == "ASK":
            return address
        try:
            self._read_map(self._conn(address), address)
        except ReplyError:  # not allowed to read the map: learn the slot
            if not self.cluster:
                self._slots, self.cluster = self._slots[:1] * SLOTS, True
            self._slots[keyslot(key)] = address
            self.version += 1
            self._learning = True
        return None

    def call(self, key: bytes | str, *args: Any) -> Any:
        """One command on ``key``; an error reply raises ReplyError."""
        reply = self.run(key, pack(*args))
        if isinstance(reply, ReplyError):
            raise reply
        return reply

    def many(self, commands: Sequence[tuple[bytes | str, bytes]],
             read: Callable[[Connection], T] | None = None) -> list[T | ReplyError]:
        """Packed commands, each on its key, with one write per node and then their replies
        (``read``; None: ``Connection.read``), in order; error replies are returned, and
        redirected commands sent again one by one."""
        by_node: dict[Address, list[int]] = {}
        for i, (key, _) in enumerate(commands):
            by_node.setdefault(self.node(key), []).append(i)
        out: list[Any] = [None] * len(commands)
        again = []
        try:
            for address, idx in by_node.items():
                self._conn(address).send(b"".join(commands[i][1] for i in idx))
            for address, idx in by_node.items():
                conn = self._conn(address)
                for i in idx:
                    try:
                        reply: Any = conn.read() if read is None else read(conn)
                    except ReplyError as exc:
                        reply = exc
                    if _redirected(reply) or (self._learning and isinstance(reply, ReplyError) and
                                              str(reply).startswith("CLUSTERDOWN Hash slot not served")):
                        again.append(i)
                    out[i] = reply
        except BaseException:
            self.reset()  # replies still pending on some connection: none of them is usable
            raise
        for i in again:
            key, command = commands[i]
            try:
                out[i] = self.run(key, command, read)
            except ReplyError as exc:
                out[i] = exc
        return out

    def pipeline(self, commands: Sequence[tuple]) -> list[Any]:
        """Commands whose first argument after the name is their key (``("XLEN", key)``),
        sent together: ``many`` with ``Connection.read``."""
        return self.many([(c[1], pack(*c)) for c in commands])


__all__ = ["Nodes", "SLOTS", "keyslot"]
