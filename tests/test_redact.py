"""The redaction function (commscope/redact.py): every credential kind it promises to hide,
embedded in generated text, is hidden with exactly its value removed; text that holds no
credential comes back unchanged."""

from __future__ import annotations

import string

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from commscope.redact import MARK, Redactor, is_secret_name, mask, redact

R = Redactor()  # no environment secrets: what these tests see is the same everywhere

# Filler around a secret: lower-case words, digits and punctuation that start no rule (no
# '=', '-', '@', '_', quotes, no upper case: no token prefix, no option, no pair).
FILLER = st.text(alphabet=string.ascii_lowercase + string.digits + " .,:;()[]/", max_size=40).filter(
    lambda t: "bearer" not in t and "basic" not in t  # "Bearer x1y2z3w4" anywhere is a credential
    and R.mask(t.encode()) == t.encode())  # (nor "pw:0", a password by its key: filler holds none, CI at 4456c4f)
VALUE = st.text(alphabet=string.ascii_letters + string.digits + "_.~+/!$*%", min_size=6, max_size=40).filter(
    lambda v: v[-1] not in ".!$*%" and v[0] != "/")  # (a path under a `key` name is a path, not a secret)
SECRET_NAMES = st.sampled_from([
    "hf-token", "api-key", "password", "db-passwd", "client-secret", "aws_secret_access_key", "auth", "credentials",
    "apiKey", "hfToken", "wandb_api_key", "access-token", "secret", "private-key", "passphrase", "authorization"])
ENV_NAMES = st.sampled_from(["WANDB_API_KEY", "HF_TOKEN", "PGPASSWORD", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN",
                             "OPENAI_API_KEY", "DB_PASSWORD", "SLACK_SIGNING_SECRET"])
HOST = st.from_regex(r"[a-z][a-z0-9]{0,10}(\.[a-z0-9]{1,8}){0,2}(:[1-9][0-9]{1,4})?", fullmatch=True)
PATH = st.from_regex(r"[a-z0-9]{1,8}(/[a-z0-9._]{1,8}){0,3}", fullmatch=True)
URL_PASSWORD = st.text(alphabet=string.ascii_letters + string.digits + "-._~!$&'()*+,;=", min_size=1, max_size=30) | \
    st.builds(lambda a, b: a + "%40" + b, st.text(string.ascii_letters, min_size=1, max_size=8),
              st.text(string.digits, min_size=1, max_size=8))
ALNUM = string.ascii_letters + string.digits


def _tok(alphabet: str, lo: int, hi: int) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, min_size=lo, max_size=hi)


# (the token as it appears, what the redacted text shows instead)
SHAPES = st.one_of(
    _tok(ALNUM, 16, 40).map(lambda v: ("hf_" + v, "hf_" + MARK)),
    st.tuples(st.sampled_from(["sk_live_", "rk_test_"]), _tok(ALNUM, 16, 40)).map(lambda t: (t[0] + t[1], t[0] + MARK)),
    st.tuples(st.sampled_from(string.digits), _tok(ALNUM + "-_", 19, 60)).map(
        lambda t: ("sk-" + t[0] + t[1], "sk-" + MARK)),
    st.tuples(st.sampled_from("pousr"), _tok(ALNUM, 36, 40)).map(lambda t: (f"gh{t[0]}_{t[1]}", f"gh{t[0]}_{MARK}")),
    _tok(ALNUM + "_", 22, 82).map(lambda v: ("github_pat_" + v, "github_pat_" + MARK)),
    _tok(ALNUM + "-_", 20, 20).map(lambda v: ("glpat-" + v, "glpat-" + MARK)),
    st.tuples(st.sampled_from(["AKIA", "ASIA"]), _tok(string.ascii_uppercase + string.digits, 16, 16)).map(
        lambda t: (t[0] + t[1], t[0] + MARK)),
    st.tuples(st.sampled_from("abpr"), _tok(ALNUM + "-", 10, 40)).map(
        lambda t: (f"xox{t[0]}-{t[1]}", f"xox{t[0]}-{MARK}")),
    _tok(ALNUM + "-_", 35, 35).map(lambda v: ("AIza" + v, "AIza" + MARK)),
    st.tuples(_tok(ALNUM + "-_", 10, 40), _tok(ALNUM + "-_", 10, 80), _tok(ALNUM + "-_", 10, 43)).map(
        lambda t: (f"eyJ{t[0]}.eyJ{t[1]}.{t[2]}", "eyJ" + MARK)),
)


def embeddings() -> st.SearchStrategy[tuple[str, str, str]]:
    """(text holding a secret, the secret, the text as redacted)."""
    return st.one_of(
        st.tuples(SECRET_NAMES, VALUE).map(lambda t: (f"--{t[0]} {t[1]}", t[1], f"--{t[0]} {MARK}")),
        st.tuples(SECRET_NAMES, VALUE).map(lambda t: (f"--{t[0]}={t[1]}", t[1], f"--{t[0]}={MARK}")),
        st.tuples(ENV_NAMES, VALUE).map(lambda t: (f"{t[0]}={t[1]}", t[1], f"{t[0]}={MARK}")),
        st.tuples(SECRET_NAMES, VALUE).map(lambda t: (f'{{"{t[0]}": "{t[1]}"}}', t[1], f'{{"{t[0]}": "{MARK}"}}')),
        st.tuples(st.sampled_from(["postgres", "https", "redis", "mysql+pymysql", "amqp"]),
                  st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), URL_PASSWORD, HOST, PATH).map(
            lambda t: (f"{t[0]}://{t[1]}:{t[2]}@{t[3]}/{t[4]}", t[2], f"{t[0]}://{t[1]}:{MARK}@{t[3]}/{t[4]}")),
        st.tuples(st.sampled_from(["password", "token", "key", "api_key", "access_token", "pass%77ord", "X-Amz-Signature",
                                   "sig"]), VALUE.filter(lambda v: "%" not in v), HOST, PATH).map(
            lambda t: (f"https://{t[2]}/{t[3]}?page=2&{t[0]}={t[1]}&x=1", t[1],
                       f"https://{t[2]}/{t[3]}?page=2&{t[0]}={MARK}&x=1")),
        st.tuples(st.sampled_from(["Bearer", "Basic"]), _tok(ALNUM + "._~+/=-", 12, 60)).map(
            lambda t: (f"Authorization: {t[0]} {t[1]}", t[1], f"Authorization: {t[0]} {MARK}")),
        st.tuples(st.sampled_from(["", "RSA ", "EC ", "OPENSSH "]), _tok(ALNUM + "+/=\n", 20, 200)).map(
            lambda t: (f"-----BEGIN {t[0]}PRIVATE KEY-----\n{t[1]}\n-----END {t[0]}PRIVATE KEY-----",
                       t[1].strip("\n") or t[1],
                       f"-----BEGIN {t[0]}PRIVATE KEY-----{MARK}-----END {t[0]}PRIVATE KEY-----")),
        SHAPES.map(lambda t: (t[0], t[0], t[1])),
    )


@settings(max_examples=400, deadline=None)
@given(FILLER, embeddings(), FILLER)
def test_no_credential_survives_and_nothing_else_is_removed(before, embedded, after):
    text, secret, expected = embedded
    assume(secret not in f"{before} {expected} {after}")  # (a one-letter password that is also the host)
    out = R.redact(f"{before} {text} {after}")
    assert secret not in out
    assert out == f"{before} {expected} {after}"
    assert R.redact(out) == out  # redacting again (a reader, over a redacted trace) changes nothing


@settings(max_examples=200, deadline=None)
@given(FILLER, embeddings(), FILLER)
def test_masking_keeps_the_length_and_hides_the_same(before, embedded, after):
    text, secret, expected = embedded
    assume(secret not in f"{before} {expected} {after}")
    data = f"{before} {text} {after}".encode()
    hidden = R.mask(data)
    assert len(hidden) == len(data)
    assert secret.encode() not in hidden
    assert hidden.startswith(before.encode()) and hidden.endswith(after.encode())


# Text that holds no credential: what commscope records every day.
BENIGN = st.lists(st.one_of(
    st.sampled_from([
        "train.py:42 in step", "--lr 3e-4", "--max-tokens 512", "--tokenizer gpt2", "--num-layers=32",
        "TOKENIZERS_PARALLELISM=false", "--password-stdin", "--token-file /run/secrets/hf", "--key-id abc",
        "Connection closed by peer [127.0.0.1]:43210", "ssh://git@github.com/org/repo.git",
        "https://huggingface.co/meta-llama/Llama-2-7b?revision=main&x=1",
        "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)",
        "RuntimeError: Expected all tensors to be on the same device", "redis://localhost:6379/0?job=j",
        "task-manager-service-account-prod-01", "hf_hub_download_with_retries", "sk-learn", "skeleton-key",
        "ghost_protocol_handler", "{'lr': 0.1, 'keys': 3}", "Authorization required", "eyJ", "AKIA",
        "/home/alice/.cache/huggingface/hub", "os.environ['HOME']", "GPU 3: 79.2 GiB used",
        "--sort-key name --text-key text --pad-token '<pad>' --eos-token </s>", "{'pad_token': '<pad>'}",
        "NCCL_IB_PKEY=0", "sig=15", "--hotkey F5", "--no-bypass x", "Basic transformer configuration",
        "run-sk-learn-baseline-experiment-2024", "--add-eos-token data.jsonl", "key=/default_pg/0//nccl//cuda//0",
        "store_key=abc:1",
        "missing fields: ['password', 'username']", "KeyError: 'password'", "token embeddings are computed",
        "Bearer authentication failed", "if key == other:", "password=None", "https://registry.npmjs.org/@scope/pkg",
        "http://host:8080/x?mail=a@b.com", "https://host:443/@alice", "/srv/app/token:42",
    ]),
    FILLER,
), max_size=8).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(BENIGN)
def test_text_without_credentials_comes_back_unchanged(text):
    assert R.redact(text) == text
    assert R.mask(text.encode()) == text.encode()


@pytest.mark.parametrize("name, secret", [
    ("hf-token", True), ("api-key", True), ("apiKey", True), ("PGPASSWORD", True), ("WANDB_API_KEY", True),
    ("pass%77ord", True), ("X-Amz-Signature", True), ("auth", True), ("client_secret", True),
    ("max-tokens", False), ("tokenizer", False), ("token-file", False), ("password-stdin", False),
    ("TOKENIZERS_PARALLELISM", False), ("key-id", False), ("author", False), ("num_keys", False),
])
def test_secret_names_are_told_by_their_last_word(name, secret):
    assert is_secret_name(name) is secret


def test_argv_hides_the_word_after_a_secret_option_and_keeps_the_rest():
    argv = ["train.py", "--password", "hunter2!", "--hf-token", "hf_" + "x" * 34, "--lr", "3", "--use-auth-token",
            "--epochs", "2", "--tokenizer", "gpt2", "--api-key=sk-" + "a" * 24, "-p", "8080"]
    assert R.args(argv) == ["train.py", "--password", MARK, "--hf-token", MARK, "--lr", "3", "--use-auth-token",
                            "--epochs", "2", "--tokenizer", "gpt2", f"--api-key={MARK}", "-p", "8080"]


def test_argv_hides_a_users_password_and_a_mysql_clients():
    assert R.args(["curl", "-u", "bob:pw", "--user", "a:", "-U", "1000:1000", "https://h"]) == [
        "curl", "-u", f"bob:{MARK}", "--user", "a:", "-U", "1000:1000", "https://h"]
    assert R.args(["/usr/bin/mysql", "-uroot", "-pHunter2", "-p", "db"]) == [
        "/usr/bin/mysql", "-uroot", f"-p{MARK}", "-p", "db"]
    assert R.args(["python", "-p8080", "-u"]) == ["python", "-p8080", "-u"]


def test_the_environments_secret_values_are_hidden_wherever_they_appear():
    env = {"WANDB_API_KEY": "0123456789abcdef0123", "HOME": "/home/alice", "LR": "3e-4", "SHORT_KEY": "abc"}
    r = Redactor.from_environ(env)
    assert r.redact("login failed for 0123456789abcdef0123 in /home/alice") == f"login failed for {MARK} in /home/alice"
    assert r.redact("abc is too short to be looked for") == "abc is too short to be looked for"


@pytest.mark.parametrize("text, expected", [
    ("cannot reach postgres://admin:hunter2@db:5432/runs", f"cannot reach postgres://admin:{MARK}@db:5432/runs"),
    ("redis://:p@ss/w?rd#x@h/0", f"redis://:{MARK}@h/0"),  # an unencoded '/', '?', '#', '@' in a password
    ("redis://hunter2secret@h", f"redis://{MARK}@h"),  # redis: a bare user info is the password
    ("'postgres://u:pw@db/x'", f"'postgres://u:{MARK}@db/x'"),
    # a password may hold an unencoded '/', '?', '#' or '@' (even one that starts like a port)
    ("postgres://admin:2024/Summer@db/x", f"postgres://admin:{MARK}@db/x"),
    ("https://u:pw@host/x?mail=a@b.com", f"https://u:{MARK}@host/x?mail=a@b.com"),
    ('{"url":"amqp://u:pw@mq/v","other":"x"}', f'{{"url":"amqp://u:{MARK}@mq/v","other":"x"}}'),
    ("Config(password=hunter2, lr=3)", f"Config(password={MARK}, lr=3)"),
    ("f(api_key='a b c')", f"f(api_key='{MARK}')"),
    ("-----BEGIN PRIVATE KEY-----\nMIIE (cut short", f"-----BEGIN PRIVATE KEY-----{MARK}"),
    ("BEGIN PRIVATE KEY-----MIIE (a cut header)", f"BEGIN PRIVATE KEY-----{MARK}"),
    ("-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOY\n-----END PGP PRIVATE KEY BLOCK-----",
     f"-----BEGIN PGP PRIVATE KEY BLOCK-----{MARK}-----END PGP PRIVATE KEY BLOCK-----"),
    # what Python prints: an argv list (CalledProcessError), values that are not plain strings
    ("Command '['train', '--hf-token', 'abc123xyz']' returned non-zero exit status 1.",
     f"Command '['train', '--hf-token', '{MARK}']' returned non-zero exit status 1."),
    ("requests.get(url, auth=('user', 'pw'))", f"requests.get(url, auth={MARK})"),
    ("{'password': b'hunter2', 'x': SecretStr('y'), 'api_key': SecretStr('z')}",
     f"{{'password': b'{MARK}', 'x': SecretStr('y'), 'api_key': {MARK}}}"),
    ("{'credentials': {'user': 'u', 'pw': 'p'}, 'lr': 3}", f"{{'credentials': {MARK}, 'lr': 3}}"),
    ("Namespace(password='it\\'s \"q\"', lr=3)", f"Namespace(password='{MARK}', lr=3)"),
    ('{"cfg": "{\\"password\\": \\"abc\\"}"}', f'{{"cfg": "{{\\"password\\": \\"{MARK}\\"}}"}}'),
    ("('password', 'abc123')", f"('password', '{MARK}')"),
    ("{'name': 'HF_TOKEN', 'value': 'abc123'}", f"{{'name': 'HF_TOKEN', 'value': '{MARK}'}}"),
    # source lines in tracebacks, config printouts, headers
    ('    os.environ["HF_TOKEN"] = "abc123xyz"', f'    os.environ["HF_TOKEN"] = "{MARK}"'),
    ("    db_password = 'abc123xyz'", f"    db_password = '{MARK}'"),
    ("model: llama\npassword: my pass phrase\nlr: 3", f"model: llama\npassword: {MARK}\nlr: 3"),
    ("Authorization: bearer abcdefgh12345 (retrying)", f"Authorization: bearer {MARK} (retrying)"),
    ("Cookie: session=abc123; theme=dark", f"Cookie: {MARK}"),
    ("X-Api-Key: abc123xyz", f"X-Api-Key: {MARK}"),
    ("curl -H X-Auth-Token:abc123xyz x", f"curl -H X-Auth-Token:{MARK} x"),
    # a header's name as a URL's user: its password alone is hidden, the host stays
    ("git clone https://x-access-token:ghs_abcdefghijklmnopqrstuvwxyz0123456789@github.com/org/repo.git",
     f"git clone https://x-access-token:{MARK}@github.com/org/repo.git"),
    ("--password -Xhunter2 --lr 3", f"--password {MARK} --lr 3"),
    ("https://hooks.slack.com/services/T0/B0/abcdefgh1234", f"https://hooks.slack.com/services/T0/B0/{MARK}"),
    ("postgres://admin:2024/Summer@db/x", f"postgres://admin:{MARK}@db/x"),
    # a '/' then an '=' before the '@' (base64, an AWS secret key): no query, since no port came before
    ("postgres://user:Xy3/kP9+ab==@db:5432/app", f"postgres://user:{MARK}@db:5432/app"),
    ("redis://:PW/b=c@127.0.0.1:6379/0", f"redis://:{MARK}@127.0.0.1:6379/0"),
    ("redis://:pw/@h:1/0", f"redis://:{MARK}@h:1/0"),
    # a password of digits that ends in '/': no host before the ':' (``host:443/@alice`` is a path)
    ("redis://:12345/@host:6379/0", f"redis://:{MARK}@host:6379/0"),
    ("rediss://:2024/@10.0.0.5:6380", f"rediss://:{MARK}@10.0.0.5:6380"),
    ("https://:99/@example.com/x", f"https://:{MARK}@example.com/x"),
    ("redis://:pre?x=tail@h/0", f"redis://:{MARK}@h/0"),
    # ... even where digits come first, like a port (an '=' is a query's only after a '?')
    ("https://user:12/ab==@host/path", f"https://user:{MARK}@host/path"),
    ("amqp://guest:12345/=x@rabbit:5672/v", f"amqp://guest:{MARK}@rabbit:5672/v"),
    # token shapes inside a name; npm and Google OAuth tokens; --pwd
    ("/data/run_hf_AbCdEf0123456789XYZ/x", f"/data/run_hf_{MARK}/x"),
    ("clone-ghp_AbCdEf0123456789XYZab", f"clone-ghp_{MARK}"),
    ("npm_abcdefghijABCDEFGHIJ0123456789abcdef", f"npm_{MARK}"),
    ("ya29.a0AfH6SMBxyzxyzxyzxyzxyzxyz", f"ya29.{MARK}"),
    ("--pwd hunter22", f"--pwd {MARK}"),
    # PyPI, Databricks, Docker Hub and Vault tokens; curl's user:password; a MySQL client's -p
    ("twine upload -p pypi-AgEIcHlwaS5vcmcCJDAwMDAwMDAw", f"twine upload -p pypi-{MARK}"),
    ("host=x token=dapi0123456789abcdef0123456789abcdef", f"host=x token={MARK}"),
    ("auth failed for dapi0123456789abcdef0123456789abcdef", f"auth failed for dapi{MARK}"),
    ("login dckr_pat_AbCdEfGhIjKlMnOpQrStUv failed", f"login dckr_pat_{MARK} failed"),
    ("vault said hvs.CAESIJabcdefghijklmnopqrstuv", f"vault said hvs.{MARK}"),
    ("curl -u alice:s3cret https://h/x", f"curl -u alice:{MARK} https://h/x"),
    ("curl -ualice:s3cret --proxy-user bob:pw2 x", f"curl -ualice:{MARK} --proxy-user bob:{MARK} x"),
    ("curl --user=alice:s3cret", f"curl --user=alice:{MARK}"),
    ("Command '['curl', '-u', 'bob:pw1']' failed", f"Command '['curl', '-u', 'bob:{MARK}']' failed"),
    ("mysql -u root -pHunter2 runs", f"mysql -u root -p{MARK} runs"),
    ("mysqldump -p'pass word' runs", f"mysqldump -p'{MARK}' runs"),
    # ... and what only looks like them: a uid:gid, python -u, a URL after -u, ssh's port
    ("docker run -u 1000:1000 img", "docker run -u 1000:1000 img"),
    ("python -u train.py -p 8080", "python -u train.py -p 8080"),
    ("pip -u https://u:pw@h/x", f"pip -u https://u:{MARK}@h/x"),
    ("ssh -p 22 host -pX", "ssh -p 22 host -pX"),
    ("dapi0123 and pypi-other", "dapi0123 and pypi-other"),
])
def test_odd_spellings(text, expected):
    assert R.redact(text) == expected


def test_a_password_from_the_environment_is_known_even_where_it_looks_like_a_path():
    """``commscope run`` hands a store URL's password to the ranks in
    $COMMSCOPE_REDIS_PASSWORD: one starting with '/' was skipped as a path (helper-80);
    a variable naming a file of credentials still is."""
    r = Redactor.from_environ({"COMMSCOPE_REDIS_PASSWORD": "/xK9pQ2mZ7",
                               "GOOGLE_APPLICATION_CREDENTIALS": "/home/me/key.json"})
    assert r.redact("AUTH /xK9pQ2mZ7 failed") == f"AUTH {MARK} failed"
    assert r.redact("reading /home/me/key.json") == "reading /home/me/key.json"


def test_the_module_functions_use_this_processs_environment(monkeypatch):
    from commscope import redact as module

    monkeypatch.setenv("MY_SERVICE_TOKEN", "s3rv1ce-t0ken-value")
    monkeypatch.setattr(module, "_default", None)
    assert module.redact("x s3rv1ce-t0ken-value y") == f"x {MARK} y"
    assert mask(b"s3rv1ce-t0ken-value") == b"*" * len("s3rv1ce-t0ken-value")


def test_every_free_text_key_of_the_schema_is_redacted_when_read():
    """``schema.TEXT_KEYS`` follows ``RawEvent``'s ``Text`` fields, and each is redacted."""
    from commscope import schema
    from commscope.events import decode

    assert set(schema.TEXT_KEYS) == {"site", "exc", "argv", "store", "gpu_error", "reason", "text", "no_spool"}
    secret = "hf_" + "Q7w" * 8
    ev = decode(('{"type":"stack","rank":0,"ts":1,"v":3,"reason":"x ' + secret + '","exc":"' + secret
                 + '","threads":[{"tid":1,"name":"' + secret + '","frames":[["/a/' + secret + '.py",3,"'
                 + secret + '"]]}]}').encode(), 0)
    assert secret not in repr(ev) and ev["threads"][0]["frames"][0][0] == "/a/hf_***.py"


def test_the_redaction_bench_runs(capsys):
    """``commscope bench redact --quick`` (the figures docs/security.md quotes) runs."""
    import argparse

    from commscope.bench import redact as bench

    assert bench.run(argparse.Namespace(events=2_000, rounds=1, quick=True)) == 0
    out = capsys.readouterr().out
    assert "hostile text" in out and "native blocks" in out


def test_a_quoted_value_longer_than_the_scan_or_triple_quoted_leaves_no_tail():
    # A closing quote past _SCAN left the value's tail (the secret's end) in the text; a triple-quoted
    # literal (a traceback's source line) was read as the empty string "" and kept whole.
    secret = "Tr1pleQuot3dS3cret"
    for n in (4090, 4100, 6000):
        text = 'password="' + "A" * n + secret + '" rest\nnext'
        assert secret[-5:] not in redact(text) and redact(text).endswith("\nnext")
        assert secret[-5:].encode() not in mask(text.encode())
    for text in (f'PASSWORD = """{secret}"""', f"api_key = '''{secret}'''", f'{{"token": """{secret}"""}}'):
        assert secret not in redact(text), text
    assert redact('password="" and x') == 'password="" and x'


def test_the_working_directory_is_not_taken_for_a_password(monkeypatch):
    # PWD's last word is pwd (a password's name): every path under the working directory was ***.
    r = Redactor.from_environ({"PWD": "/home/alice/proj", "OLDPWD": "/home/alice", "DB_PWD": "/xK9pw-secret",
                               "HF_TOKEN_PATH": "/home/alice/.hf"})
    assert r.redact("/home/alice/proj/train.py:12 in main") == "/home/alice/proj/train.py:12 in main"
    assert r.redact("cd /home/alice") == "cd /home/alice"
    assert r.redact("conn /xK9pw-secret") == "conn ***"


def test_a_foreign_trace_s_host_and_job_metadata_are_redacted_when_read():
    # meta.host and job.json's strings were only made visible: export's process names and copy's
    # rank files and job.json kept a credential written there.
    import json

    from commscope.schema import decode_job, redact_event

    secret = "postgres://admin:H0stS3cret-77@db/x --password H0stS3cret-77"
    e = redact_event({"type": "meta", "rank": 0, "ts": 1, "host": "node1 " + secret})
    assert "H0stS3cret" not in e["host"] and e["host"].startswith("node1 postgres://admin:***@db/x")
    job, why = decode_job(json.dumps({"created": 1, "world_size": 2, "backend": "gloo " + secret, "schema": 3,
                                      "commscope": "0.1.0", "host": "vm " + secret, "attempt": 0,
                                      "job": "j1"}).encode())
    assert why is None and "H0stS3cret" not in json.dumps(job) and job["job"] == "j1"


@pytest.mark.parametrize("text, expected", [
    # a name joined to its value by a colon, no space: an option's other spelling, a log's key:value
    ("--password:Zq9xK2mW7vB4", f"--password:{MARK}"),
    ("-db-token:Zq9xK2mW7vB4 --lr 3", f"-db-token:{MARK} --lr 3"),
    ("login failed (user:bob password:hunter2!)", f"login failed (user:bob password:{MARK})"),
    ("{api_key:'Zq9 x'}", f"{{api_key:'{MARK}'}}"),
    # ... and what only looks like it: call sites, C++ names, times, URLs, hosts, other names
    ("token.py:12 in step", "token.py:12 in step"),
    ("/srv/secret:3 in f", "/srv/secret:3 in f"),
    ("std::string key::value", "std::string key::value"),
    ("at 12:30 --max-tokens:512 tokenizer:gpt2", "at 12:30 --max-tokens:512 tokenizer:gpt2"),
    ("https://auth:443/x redis://:pw@key:6379/0", f"https://auth:443/x redis://:{MARK}@key:6379/0"),
    ("key:/default_pg/0//cuda sig:15", "key:/default_pg/0//cuda sig:15"),
])
def test_a_name_joined_to_its_value_by_a_colon(text, expected):
    """``--password:secret`` (helper-123): only ``name: value`` starting a line was read,
    so a colon with no space after it kept the value, in argv and in any text."""
    assert R.redact(text) == expected


def test_argv_hides_a_value_joined_by_a_colon():
    assert R.args(["train.py", "--password:Zq9xK2mW7vB4", "--tokenizer:gpt2"]) == [
        "train.py", f"--password:{MARK}", "--tokenizer:gpt2"]


AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize("text, expected", [
    # an AWS secret access key beside its key id: only the id (a shape) was hidden
    (f"creds AKIAIOSFODNN7EXAMPLE {AWS_SECRET}", f"creds AKIA{MARK} {MARK}"),
    (f"AKIAIOSFODNN7EXAMPLE:{AWS_SECRET}", f"AKIA{MARK}:{MARK}"),
    (f"Credentials('ASIAIOSFODNN7EXAMPLE', '{AWS_SECRET}', None)", f"Credentials('ASIA{MARK}', '{MARK}', None)"),
    (f"bob,AKIAIOSFODNN7EXAMPLE,{AWS_SECRET},us-east-1", f"bob,AKIA{MARK},{MARK},us-east-1"),
    # session tokens (STS): their base64 header is their shape
    ("token IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQ end", f"token IQoJb3JpZ2lu{MARK} end"),
    ("FwoGZXIvYXdzEJr//////////wEaDKzAbCdEf", f"FwoGZXIvYXdz{MARK}"),
    # ... not a git commit, a sha256 digest or a path beside an id, nor 40 characters alone
    ("AKIAIOSFODNN7EXAMPLE at 3f786850e387550fdab836ed7e6dc881de23001b",
     f"AKIA{MARK} at 3f786850e387550fdab836ed7e6dc881de23001b"),
    ("AKIAIOSFODNN7EXAMPLE /data/9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08.bin",
     f"AKIA{MARK} /data/9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08.bin"),
    (f"checkpoint {AWS_SECRET}", f"checkpoint {AWS_SECRET}"),
])
def test_an_aws_secret_key_beside_its_id_and_session_tokens(text, expected):
    assert R.redact(text) == expected
    assert len(R.mask(text.encode())) == len(text.encode())


@pytest.mark.parametrize("text, expected", [
    # Slack's refresh tokens (token rotation): xoxe-1-…, and xoxe.xoxb-… (its rotating tokens)
    ("refresh xoxe-1-My0xNjI4MDktMjAyMy0wNS0xMSMxNjgz", f"refresh xoxe-{MARK}"),
    ("xoxe.xoxb-1-My0xNjI4MDktMjAyMy0wNS0x", f"xoxe.xoxb-{MARK}"),
    ("xoxe-short", "xoxe-short"),
])
def test_slack_refresh_tokens(text, expected):
    assert R.redact(text) == expected


@pytest.mark.parametrize("text, expected", [
    # programs whose short flag takes a password, beside MySQL's -p: the value was kept
    ("sshpass -p Hunter2x ssh host", f"sshpass -p {MARK} ssh host"),
    ("Command '['sshpass', '-p', 'Hunter2x', 'ssh', 'h']' returned non-zero exit status 5.",
     f"Command '['sshpass', '-p', '{MARK}', 'ssh', 'h']' returned non-zero exit status 5."),
    ("redis-cli -h cache -a Hunter2x ping", f"redis-cli -h cache -a {MARK} ping"),
    ("docker login -u bob -p Hunter2x ghcr.io", f"docker login -u bob -p {MARK} ghcr.io"),
    ("mongosh -u admin -p 'Hunter 2x' --host db", f"mongosh -u admin -p '{MARK}' --host db"),
    ("7z x a.7z -pHunter2x", f"7z x a.7z -p{MARK}"),
    ("unzip -P Hunter2x a.zip", f"unzip -P {MARK} a.zip"),
    ("ldapsearch -x -D cn=admin -w Hunter2x", f"ldapsearch -x -D cn=admin -w {MARK}"),
    ("mysql -p=Hunter2x db", f"mysql -p{MARK} db"),
    # ... and the same flags where they are no password
    ("mysql -p db", "mysql -p db"),
    ("docker run -p 8080:80 img; ssh -p 22 host; ls -a /tmp; python -p 8080",
     "docker run -p 8080:80 img; ssh -p 22 host; ls -a /tmp; python -p 8080"),
])
def test_a_programs_password_flag(text, expected):
    assert R.redact(text) == expected


def test_argv_hides_a_programs_password_flag():
    assert R.args(["sshpass", "-p", "Hunter2x", "ssh", "h"]) == ["sshpass", "-p", MARK, "ssh", "h"]
    assert R.args(["/usr/bin/redis-cli", "-a", "Hunter2x", "ping"]) == ["/usr/bin/redis-cli", "-a", MARK, "ping"]
    assert R.args(["docker", "login", "-pHunter2x"]) == ["docker", "login", f"-p{MARK}"]
    assert R.args(["docker", "run", "-p", "8080:80"]) == ["docker", "run", "-p", "8080:80"]
    assert R.args(["mongo", "-p", "--host", "h"]) == ["mongo", "-p", "--host", "h"]


@pytest.mark.parametrize("name, secret", [
    # a secret's word split by camelCase or a separator: the last word alone ("word") said nothing
    ("PassWord", True), ("DB_PassWord", True), ("Pass%57ord", True), ("pass_phrase", True), ("PassWd", True),
    # ... and words that only end like one, or counts of tokens
    ("keyWord", False), ("crossWord", False), ("maxTokens", False), ("num_tokens", False), ("TokenCount", False),
])
def test_a_secrets_word_split_in_two(name, secret):
    assert is_secret_name(name) is secret


def test_a_query_key_spelled_oddly():
    """``?Pass%57ord=`` decodes to ``PassWord``, read as the words Pass and Word (helper-123)."""
    assert R.redact("https://h/x?Pass%57ord=Zq9xK2mW7vB4&page=2") == f"https://h/x?Pass%57ord={MARK}&page=2"
    assert R.args(["train.py", "--DB-PassWord", "Zq9xK2mW7vB4"]) == ["train.py", "--DB-PassWord", MARK]
