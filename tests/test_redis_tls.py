"""Redis over TLS (``rediss://``) against real TLS-only servers: what a URL must carry, and
what each failure says.  A Redis asks clients for a certificate by default
(``tls-auth-clients yes``); a Redis Cluster's nodes announce addresses their certificates
must name.  The store contract itself runs over TLS in tests/test_store_contract.py."""

from __future__ import annotations

import pytest
from redis_fixture import *  # noqa: F403  (tls_files, redis_tls_cluster and what they need)
from redis_fixture import require_openssl, require_redis_server
from test_store_contract import ev, ids, lines

from commscope.bench.redis_server import RedisCluster, RedisServer, make_tls_files
from commscope.store import StoreError, open_reader, open_writer
from commscope.store.redis_url import parse_url


@pytest.fixture(scope="module")
def tls_server(tls_files):
    server = RedisServer(binary=require_redis_server(), tls=tls_files).start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def localhost_cluster(tmp_path_factory):
    """A TLS cluster whose certificates name ``localhost`` only, while its nodes announce
    127.0.0.1: reached at localhost, its other nodes are not what their certificates name."""
    require_openssl()
    tls = make_tls_files(tmp_path_factory.mktemp("tls-localhost"), names="DNS:localhost")
    cluster = RedisCluster(3, binary=require_redis_server(), tls=tls).start()
    yield cluster
    cluster.close()


def _refused(url: str) -> str:
    with pytest.raises(StoreError) as info:
        open_reader(url).read_all()
    return str(info.value)


def test_mutual_tls_round_trip(tls_server):
    url = tls_server.url  # the CA, the client's certificate and key
    w = open_writer(url, "tls-job", 0, {"world_size": 1})
    w.write(lines(ev(0, 1), ev(0, 2)))
    reader = open_reader(url)
    assert ids(reader.read_all()) == [(0, 1), (0, 2)] and reader.job()["job"] == "tls-job"
    w.close()
    reader.close()


def test_each_missing_piece_is_named(tls_server, tls_files):
    port = tls_server.port
    no_client = _refused(f"rediss://127.0.0.1:{port}/0?{tls_files.query(client=False)}")
    # (the server's alert, or its close when that wins the race: either way the same advice)
    assert "ask for a client certificate" in no_client or "asks for a client certificate" in no_client
    assert "add ssl_certfile=FILE&ssl_keyfile=FILE" in no_client
    no_ca = _refused(f"rediss://127.0.0.1:{port}/0?ssl_certfile={tls_files.client_cert}"
                     f"&ssl_keyfile={tls_files.client_key}")
    assert "not trusted" in no_ca and "ssl_ca_certs=FILE" in no_ca
    plain = _refused(f"redis://127.0.0.1:{port}/0")
    assert "use rediss://" in plain
    missing = _refused(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={tls_files.ca}&ssl_certfile=/nonexistent.crt")
    assert "cannot read the client certificate '/nonexistent.crt'" in missing
    plain_server = RedisServer(binary=require_redis_server()).start()  # rediss:// to a server without TLS
    try:
        without_tls = _refused(f"rediss://127.0.0.1:{plain_server.port}/0?timeout=1&{tls_files.query()}")
    finally:
        plain_server.close()
    assert "no answer within 1 s (or a server without TLS: then use redis://)" in without_tls
    # nothing checked (ssl_cert_reqs=none): still the client certificate the server asks for
    unchecked = (f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=none&ssl_certfile={tls_files.client_cert}"
                 f"&ssl_keyfile={tls_files.client_key}")
    open_writer(unchecked, "tls-unchecked", 0, {"world_size": 1}).close()  # (a reader found no job alone)


def test_cluster_nodes_whose_certificates_do_not_name_their_announced_address(localhost_cluster):
    port, tls = localhost_cluster.servers[0].port, localhost_cluster.tls
    url = f"rediss://localhost:{port}/0?{tls.query()}"
    message = _refused(url)
    assert "(cluster node 127.0.0.1:" in message and "does not name 127.0.0.1" in message
    assert "cluster-preferred-endpoint-type hostname" in message and "ssl_check_hostname=false" in message
    chain_only = url + "&ssl_check_hostname=false"
    writers = [open_writer(chain_only, "named", r, {"world_size": 8}) for r in range(8)]
    for r, w in enumerate(writers):
        w.write(lines(ev(r, 1)))
    reader = open_reader(chain_only)
    assert sorted(ids(reader.read_all())) == [(r, 1) for r in range(8)]
    assert len(reader._nodes.masters()) == 3  # (the read reached the masters that hold the streams)
    for w in writers:
        w.close()
    reader.close()


@pytest.mark.parametrize(("url", "error"), [
    ("rediss://h/0?ssl_check_hostname=maybe", "bad ssl_check_hostname"),
    ("rediss://h/0?ssl_keyfile=k.pem", "ssl_keyfile without ssl_certfile"),
    ("redis://h/0?ssl_ca_certs=ca.pem", "not a TLS URL: use rediss://"),
])
def test_bad_tls_options_are_named(url, error):
    with pytest.raises(StoreError, match=error):
        parse_url(url)


def test_a_shown_url_keeps_its_tls_options_and_no_secret():
    t = parse_url("rediss://u:pw@h:7000/0?ssl_ca_certs=/c/ca.crt&ssl_certfile=/c/me.crt&ssl_keyfile=/c/me.key"
                  "&ssl_check_hostname=false&job=j")
    shown = t.display()
    assert "pw" not in shown and shown.startswith("rediss://u:***@h:7000/0?job=j&")
    again = parse_url(shown.replace("***", "pw"))
    assert (again.ssl_ca_certs, again.ssl_certfile, again.ssl_keyfile, again.ssl_check_hostname) == \
        ("/c/ca.crt", "/c/me.crt", "/c/me.key", False)


@pytest.mark.parametrize("exc", [__import__("ssl").SSLEOFError(8, "EOF occurred in violation of protocol"),
                                 ConnectionResetError(104, "Connection reset by peer")])
def test_a_close_during_the_handshake_without_a_certificate_reads_as_one_asked_for(exc):
    """Which the client sees first, the server's alert or its close, is a race (under load, the
    close): without a client certificate in the URL, both give the same advice."""
    from commscope.store.resp import Connection

    without = Connection(parse_url("rediss://h/0?ssl_ca_certs=ca.pem"), "rediss://h/0")
    assert "add ssl_certfile=FILE&ssl_keyfile=FILE" in without._tls_why(exc)
    given = Connection(parse_url("rediss://h/0?ssl_certfile=c.pem&ssl_keyfile=k.pem"), "rediss://h/0")
    assert "ssl_certfile" not in given._tls_why(exc)  # given: the close means something else


def test_an_encrypted_client_key_is_refused_not_prompted_for(tls_server, tls_files, tmp_path):
    """OpenSSL would ask for the passphrase on the terminal, and every rank would wait."""
    import subprocess

    encrypted = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", tls_files.client_key, "-aes256", "-passout", "pass:secret",
                    "-out", str(encrypted)], check=True, capture_output=True, stdin=subprocess.DEVNULL)
    url = (f"rediss://127.0.0.1:{tls_server.port}/0?ssl_ca_certs={tls_files.ca}&ssl_certfile={tls_files.client_cert}"
           f"&ssl_keyfile={encrypted}")
    message = _refused(url)
    assert f"the client key '{encrypted}' is encrypted" in message and "openssl pkey" in message


def test_a_full_redis_over_tls_is_said_to_be_perhaps_full(tls_files):
    """A Redis at maxclients closes a new client before the TLS handshake, without a word
    (over plain TCP it says "max number of clients reached"): with every certificate right
    the client saw only "TLS handshake failed (UNEXPECTED_EOF_WHILE_READING)"."""
    from commscope.store.resp import Connection

    server = RedisServer(binary=require_redis_server(), tls=tls_files, extra={"maxclients": 4}).start()
    held: list[Connection] = []
    try:
        url = parse_url(server.url)
        with pytest.raises(StoreError) as info:
            for _ in range(64):  # (4 clients fit: the fifth is closed)
                conn = Connection(url, server.url)
                conn.connect()
                held.append(conn)
    finally:
        for conn in held:
            conn.close()
        server.close()
    said = str(info.value)
    assert 1 <= len(held) <= 4 and "during the TLS handshake" in said, said
    assert "a Redis full of clients closes a new one so over TLS" in said and "raise maxclients" in said
    assert "ssl_certfile=FILE" not in said  # (the URL gives one)


def test_a_tls_setting_no_retry_mends_is_refused_before_the_job_runs(tls_server, tls_files, tmp_path):
    """``commscope run`` asks ``refusal`` before it starts the ranks: a wrong password was
    refused there, but a CA that does not vouch for the server, an unreadable CA file or
    client certificate let the job run unrecorded, each rank warning (helper-183).  They are
    refused now, with what the ranks would say; what a retry may mend (a reset, no answer:
    perhaps a full or a plain server) is still left to the ranks, and a right URL passes."""
    from commscope.store.redis_store import refusal

    port = tls_server.port
    client = f"ssl_certfile={tls_files.client_cert}&ssl_keyfile={tls_files.client_key}"
    assert refusal(tls_server.url) is None
    untrusted = refusal(f"rediss://127.0.0.1:{port}/0?{client}")
    assert untrusted is not None and "not trusted" in untrusted and "ssl_ca_certs=FILE" in untrusted
    no_ca = refusal(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs=/nonexistent/ca.crt&{client}")
    assert no_ca is not None and "cannot read ssl_ca_certs '/nonexistent/ca.crt'" in no_ca
    no_cert = refusal(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={tls_files.ca}&ssl_certfile=/nonexistent.crt")
    assert no_cert is not None and "cannot read the client certificate '/nonexistent.crt'" in no_cert
    assert refusal(f"redis://127.0.0.1:{port}/0") is None  # (a reset: a full server says the same)
    # and the command says it, exit 2, the job never started
    import subprocess
    import sys

    marker = tmp_path / "ran"
    done = subprocess.run([sys.executable, "-m", "commscope", "run", "--store",
                           f"rediss://127.0.0.1:{port}/0?{client}", "--", sys.executable, "-c",
                           f"open({str(marker)!r}, 'w')"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not trusted" in done.stderr, done.stdout + done.stderr
    assert not marker.exists()


@pytest.mark.parametrize(("code", "refused"), [(9, False), (10, False), (19, True), (62, True)])
def test_a_certificate_not_valid_now_is_left_to_the_ranks_to_retry(code, refused, monkeypatch):
    """A certificate not yet valid (just rotated, or this host's clock behind) or expired
    passes with time: refused before the job, it stopped a run the ranks' retries would have
    mended (helper-189).  One its CA does not vouch for, or that names another host, is
    refused; each says what it is."""
    import ssl

    from commscope.store.resp import Connection, RedisTLSRefused

    given = parse_url("rediss://127.0.0.1:1/0")
    conn = Connection(given, given.display())
    exc = ssl.SSLCertVerificationError(1, "certificate verify failed")
    exc.verify_code = code
    exc.verify_message = {9: "certificate is not yet valid", 10: "certificate has expired",
                          19: "self-signed certificate in certificate chain",
                          62: "Hostname mismatch, certificate is not valid for '127.0.0.1'."}[code]

    def fail():
        raise exc

    monkeypatch.setattr(conn, "_socket", fail)
    with pytest.raises(StoreError) as got:
        conn.connect()
    assert isinstance(got.value, RedisTLSRefused) == refused, got.value
    said = str(got.value)
    assert ("is not valid now" in said) == (not refused) and ("ssl_ca_certs=FILE" in said) == (code == 19), said
