"""A private redis-server for benchmarks and tests: free loopback port, own config and data dir.

Never touches a system Redis: the server binds 127.0.0.1 on a port nobody else holds,
keeps its data, log and config in its own directory, and is stopped by ``stop()``.
``restart()`` brings it back on the same port with the same data directory, which is
what a fault test needs to simulate a Redis restart mid-job.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

from commscope.launch import free_port
from commscope.store.redis_url import parse_url
from commscope.store.resp import Connection

REDIS_SERVER_ENV = "COMMSCOPE_REDIS_SERVER"


#: A cluster node also listens on its port + 10,000 (the cluster bus): Redis refuses ports above this
MAX_CLUSTER_PORT = 55535


def _cluster_port() -> int:
    """A free port for a cluster node whose bus port (+10,000) is free too (a port the system
    hands out may be above 55,535, which Redis refuses for a cluster node)."""
    for _ in range(200):
        port = free_port()
        if port > MAX_CLUSTER_PORT:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 10_000))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free port at or below {MAX_CLUSTER_PORT} with its cluster bus port free")


class RedisServerMissing(RuntimeError):
    pass


def find_redis_server() -> str:
    """The redis-server binary: $COMMSCOPE_REDIS_SERVER, then PATH, then /usr/bin, /usr/sbin."""
    candidates = [os.environ.get(REDIS_SERVER_ENV), shutil.which("redis-server"),
                  "/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server"]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise RedisServerMissing("redis-server not found: install the Debian package 'redis-server' "
                             f"(apt-get install redis-server) or point ${REDIS_SERVER_ENV} at the binary")


class TlsFiles(NamedTuple):
    """A private certificate authority and what it signed: the servers' certificate (whose
    names are ``names``) and a client's, each with its key (``make_tls_files``)."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    names: str

    def query(self, *, client: bool = True) -> str:
        """The store URL's options that trust this authority and present the client's
        certificate."""
        out = f"ssl_ca_certs={quote(self.ca)}"
        if client:
            out += f"&ssl_certfile={quote(self.client_cert)}&ssl_keyfile={quote(self.client_key)}"
        return out

    def cli(self) -> list[str]:
        """redis-cli's arguments for the same."""
        return ["--tls", "--cacert", self.ca, "--cert", self.client_cert, "--key", self.client_key]

    def context(self) -> ssl.SSLContext:
        """A client context with the same (names not checked: the harness pings by address)."""
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.check_hostname = False
        ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


def make_tls_files(directory: str | os.PathLike, names: str = "IP:127.0.0.1,DNS:localhost") -> TlsFiles:
    """A certificate authority, a server certificate for ``names`` (subjectAltName syntax) and
    a client certificate, made with the ``openssl`` command in ``directory``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RedisServerMissing("openssl not found: install the Debian package 'openssl' (the TLS tests make "
                                 "their certificates with it)")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        done = subprocess.run([openssl, *args], capture_output=True, text=True, cwd=d, timeout=60,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {(done.stdout + done.stderr)[-1000:]}")

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=commscope test CA")
    for who, subject, ext in (("server", "/CN=redis", f"subjectAltName={names}"),
                              ("client", "/CN=commscope", "extendedKeyUsage=clientAuth")):
        (d / f"{who}.ext").write_text(ext + "\n")
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", subject)
        run("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{who}.crt", "-days", "2", "-extfile", f"{who}.ext")
    for key in d.glob("*.key"):
        key.chmod(0o600)
    return TlsFiles(*(str(d / f) for f in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")),
                    names)


#: Starts a restart on its port tries (the port may be a client connection's for a moment)
RESTART_TRIES = 5


class RedisServer:
    """One redis-server process; ``url`` reaches it (with the password, if any).  With ``tls``
    it listens over TLS only (``rediss://``), asking clients for a certificate, as Redis does
    by default (``tls-auth-clients yes``)."""

    def __init__(self, *, password: str | None = None, appendonly: bool = False, extra: dict | None = None,
                 data_dir: str | os.PathLike | None = None, binary: str | None = None, tls: TlsFiles | None = None):
        self.binary = binary or find_redis_server()
        self.password = password
        self.own_dir = data_dir is None
        self.dir = Path(data_dir or tempfile.mkdtemp(prefix="commscope-redis-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.appendonly = appendonly
        self.extra = dict(extra or {})
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.tls = tls
        self._held: socket.socket | None = None  # the port, while stopped for a restart on it (``_hold``)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls:
            return f"rediss://{auth}127.0.0.1:{self.port}/0?{self.tls.query()}"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _config(self) -> str:
        conf = {
            "bind": "127.0.0.1", "port": str(self.port), "dir": str(self.dir), "daemonize": "no",
            "protected-mode": "yes", "logfile": str(self.dir / "redis.log"), "save": '""',
            "appendonly": "yes" if self.appendonly else "no", "appendfsync": "always",
            "appendfilename": '"appendonly.aof"', "dbfilename": "dump.rdb", "databases": "16",
        }
        if self.password:
            conf["requirepass"] = self.password
        if self.tls:
            conf.update({"port": "0", "tls-port": str(self.port), "tls-cert-file": self.tls.server_cert,
                         "tls-key-file": self.tls.server_key, "tls-ca-cert-file": self.tls.ca,
                         "tls-auth-clients": "yes", "tls-replication": "yes", "tls-cluster": "yes"})
        conf.update({k: str(v) for k, v in self.extra.items()})
        return "".join(f"{k} {v}\n" for k, v in conf.items())

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start on a free port (or the port it had, for a restart) and wait until it answers."""
        fixed = self.port != 0
        for _attempt in range(RESTART_TRIES if fixed else 5):
            if not fixed:
                self.port = _cluster_port() if self.extra.get("cluster-enabled") == "yes" else free_port()
            self._release()
            conf = self.dir / "redis.conf"
            conf.write_text(self._config())
            conf.chmod(0o600)  # it may hold the password
            self.proc = subprocess.Popen([self.binary, str(conf)], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
            if self._wait_ready(timeout):
                return self
            self._terminate()
            if fixed:
                time.sleep(0.2)  # (the port, taken meanwhile by a client's connection: freed again soon)
        log = self.dir / "redis.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(f"redis-server did not start on 127.0.0.1:{self.port}:\n{tail}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False  # exited: port taken or bad config
            if self._ping():
                return True
            time.sleep(0.02)
        return False

    def _ping(self) -> bool:
        """True once the server accepts commands (and has finished loading its data)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as plain, \
                    (self.tls.context().wrap_socket(plain) if self.tls else plain) as s:
                cmd = b""
                if self.password:
                    pw = self.password.encode()
                    cmd += b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw)
                s.sendall(cmd + b"*1\r\n$4\r\nPING\r\n")
                data = b""
                while data.count(b"\r\n") < (2 if self.password else 1):
                    chunk = s.recv(4096)
                    if not chunk:
                        return False
                    data += chunk
                return data.rstrip().endswith(b"+PONG")
        except OSError:  # (ssl.SSLError too)
            return False

    def stop(self, *, timeout: float = 10.0) -> None:
        """Clean shutdown (SIGTERM: Redis flushes its append-only file), keeping the data dir
        and the port (``_hold``: a restart takes it again)."""
        self._terminate(timeout)
        self._hold()

    def _hold(self) -> None:
        """Keep the port of a stopped server bound (not listening: clients are refused, as by
        no server), so no other process's server or connection takes it before the restart:
        a CI run's restart found it taken ("Address already in use") by a parallel test."""
        if self.port == 0 or self._held is not None:
            return
        held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            held.bind(("127.0.0.1", self.port))
        except OSError:
            held.close()
            return
        self._held = held

    def _release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.close()

    def _terminate(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def kill(self) -> None:
        """Crash it (SIGKILL), keeping the port (``_hold``)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)
        self._hold()

    def restart(self, timeout: float = 10.0) -> RedisServer:
        """Stop if running, then start again on the same port with the same data directory."""
        self._terminate()
        return self.start(timeout)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def commands(self) -> dict[str, int]:
        """Commands this server has run since it started, by name (``INFO commandstats``:
        Redis's own count, whoever sent them; a pipelined command counts as one)."""
        conn = Connection(parse_url(self.url), f"127.0.0.1:{self.port}")
        conn.connect()
        try:
            text = conn.call("INFO", "commandstats").decode()
        finally:
            conn.close()
        return command_calls(text)

    def close(self) -> None:
        """Stop and remove the data directory if this object created it."""
        self._terminate()
        self._release()
        if self.own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisServer(127.0.0.1:{self.port}, dir={self.dir})"


def command_calls(info: str) -> dict[str, int]:
    """{command: calls} of an ``INFO commandstats`` reply (``cmdstat_xread:calls=12,usec=...``;
    a subcommand is ``config|get``)."""
    out: dict[str, int] = {}
    for line in info.splitlines():
        name, _, fields = line.strip().partition(":")
        if name.startswith("cmdstat_"):
            for field in fields.split(","):
                key, _, value = field.partition("=")
                if key == "calls" and value.isdigit():
                    out[name[len("cmdstat_"):]] = int(value)
    return out


def find_redis_cli(server_binary: str | None = None) -> str:
    """redis-cli: beside the server binary, then PATH."""
    beside = os.path.join(os.path.dirname(server_binary or find_redis_server()), "redis-cli")
    for c in (beside, shutil.which("redis-cli")):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise RedisServerMissing("redis-cli not found: it comes with redis-server (apt-get install redis-server)")


class RedisCluster:
    """A private Redis Cluster of ``masters`` redis-servers on loopback, each with
    ``replicas`` replicas, made as a user makes one: ``redis-server --cluster-enabled yes``
    each, then ``redis-cli --cluster create``.  ``url`` reaches its first node;
    ``node_timeout_ms`` is how long a master may be silent before its replica takes over."""

    def __init__(self, masters: int = 3, *, replicas: int = 0, node_timeout_ms: int = 5000,
                 binary: str | None = None, tls: TlsFiles | None = None):
        self.binary = binary or find_redis_server()
        self.masters = masters
        self.replicas = replicas
        self.tls = tls
        self.servers = [RedisServer(binary=self.binary, appendonly=False, tls=tls,
                                    extra={"cluster-enabled": "yes", "cluster-config-file": "nodes.conf",
                                           "cluster-node-timeout": node_timeout_ms})
                        for _ in range(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        return self.servers[0].url

    def start(self, timeout: float = 30.0) -> RedisCluster:
        for server in self.servers:
            server.start()
        cli = find_redis_cli(self.binary)
        nodes = [f"127.0.0.1:{s.port}" for s in self.servers]
        made = subprocess.run([cli, *(self.tls.cli() if self.tls else []), "--cluster", "create", *nodes,
                               "--cluster-replicas", str(self.replicas),
                               "--cluster-yes"],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if made.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {(made.stdout + made.stderr)[-2000:]}")
        deadline = time.monotonic() + timeout
        while not all(self.info(s).get("cluster_state") == "ok" for s in self.servers):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)
        # cluster_state:ok says every slot has a master, not that the replicas hold its data:
        # a replica still in its first sync acknowledges nothing (WAIT answers 0)
        while sum(self._replicating(s) for s in self.servers) < self.masters * self.replicas:
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster's replicas did not finish their first sync")
            time.sleep(0.05)
        return self

    def cli(self, *args: str, server: RedisServer | None = None, timeout: float = 60.0) -> str:
        """redis-cli against one node (the first by default); its output."""
        port = (server or self.servers[0]).port
        tls = self.tls.cli() if self.tls else []
        done = subprocess.run([find_redis_cli(self.binary), *tls, "-p", str(port), *args], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)}: {(done.stdout + done.stderr)[-2000:]}")
        return done.stdout

    def info(self, server: RedisServer) -> dict[str, str]:
        """CLUSTER INFO of one node, as a dict ({} while it does not answer)."""
        try:
            text = self.cli("CLUSTER", "INFO", server=server, timeout=5)
        except (RuntimeError, subprocess.TimeoutExpired):
            return {}
        return dict(line.strip().split(":", 1) for line in text.splitlines() if ":" in line)

    def _replicating(self, server: RedisServer) -> bool:
        """Whether ``server`` is a replica whose link to its master is up and synced."""
        try:
            text = self.cli("INFO", "replication", server=server, timeout=5)
        except (RuntimeError, subprocess.TimeoutExpired):
            return False
        fields = dict(line.strip().split(":", 1) for line in text.splitlines() if ":" in line)
        return (fields.get("role") == "slave" and fields.get("master_link_status") == "up"
                and fields.get("master_sync_in_progress") == "0")

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Handle:
    """What ``commscope bench store --redis`` expects: ``.url`` and ``.stop()``."""

    def __init__(self, server: RedisServer):
        self.server = server
        self.url = server.url

    def stop(self) -> None:
        self.server.close()


def start_redis(*, password: str | None = None, appendonly: bool = False, extra: dict | None = None) -> _Handle:
    """Start a private redis-server; ``.stop()`` shuts it down and removes its directory."""
    return _Handle(RedisServer(password=password, appendonly=appendonly, extra=extra).start())
