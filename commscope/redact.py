"""Hiding credentials in text: the one redaction every trace string passes through.

Text from the user's program reaches a trace in many places: the command line in each
rank's ``meta``, exception messages, stack frames, call sites, store names, Flight Recorder
strings.  A trace travels (a shared filesystem, a bug report), so each of those is
redacted where it enters the trace, and again where a trace is read
(``schema.redact_event``), so that traces written by older versions are safe to show.

What is hidden, keeping what helps debugging (the argument's or key's name, the URL's
scheme, user, host and path) and marking what was removed with ``***``:

- credentials in URLs of any scheme: ``user:***@host``, and the value of a query key that
  names a secret once percent-decoded (``?password=``, ``?token=``, ``?pass%77ord=``);
- values joined to a name that says secret: ``--name value``, ``--name=value``,
  ``NAME=value``, ``name = value``, ``--name:value``, ``"name": value``, ``["name"] = value``,
  ``name: value`` starting a line, ``('--name', 'value')`` in a list or tuple repr, an environment entry
  ``{"name": "HF_TOKEN", "value": …}``.  A name says secret when its last word ends in
  token, password, passwd, passphrase, secret, credential(s) (``--hf-token``, ``PGPASSWORD``,
  ``apiKey``) or is key, pass, pw, pwd, auth, sig, creds (or its last two words joined end in
  one: ``PassWord``); not ``--max-tokens``, ``--tokenizer``,
  ``--sort-key``, ``--pad-token``.  A value is a string literal's contents, a bracketed or
  called value whole (``auth=('u', 'pw')``, ``SecretStr('…')``), or the word;
- credential headers: ``Authorization``, ``Cookie``, ``X-…-Key``/``-Token`` (the scheme
  word stays: ``Bearer ***``);
- well-known token shapes, whatever surrounds them: Hugging Face ``hf_…``, OpenAI-style
  ``sk-…``, Stripe ``sk_live_…``, GitHub ``ghp_…``/``github_pat_…``, GitLab ``glpat-…``,
  npm ``npm_…``, Google OAuth ``ya29.…``, AWS access key ids (and the secret key beside one,
  session tokens), Slack ``xox…``/``xapp-…`` and webhook URLs, Google ``AIza…``, JWTs,
  PyPI ``pypi-AgE…``, Databricks ``dapi…``, Docker Hub ``dckr_pat_…``, HashiCorp Vault ``hvs.…``,
  ``Bearer``/``Basic``/``Token`` credentials and private key blocks (PEM, PGP) (their prefix
  stays: ``hf_***``);
- a user's password on a command line: ``curl -u user:***`` (``--user``, ``--proxy-user``;
  not a uid:gid), and a program's password flag where the text (or argv[0]) names the
  program: ``mysql -p***``, ``sshpass -p ***``, ``redis-cli -a ***``, ``docker login -p ***`` (``_TOOLS``);
- the values of this process's environment variables whose names name a secret
  (``WANDB_API_KEY``, ``HF_TOKEN`` ...; not paths), wherever they appear.  Environment
  variables are never recorded; this catches a program that prints one into an exception.

Over-redacting odd text is harmless; leaking a credential is not.  A value already hidden
is never walked again, so hostile text stays near-linear (``commscope bench redact`` times
100 KB of it).  ``mask`` hides the same spans in bytes without changing their length
(records packed in place).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple
from urllib.parse import unquote_plus

__all__ = ["MARK", "Redactor", "is_secret_name", "known_texts", "mask", "redact", "redact_args"]

MARK = "***"

#: A name holds a secret when its last word (``-``, ``_``, ``.``, spaces and camelCase
#: apart) ends in one of these (``hf-token``, ``PGPASSWORD``, ``apiKey`` → ``key``) ...
_SECRET_SUFFIX = re.compile(
    r"(?:token|password|passwords|passwd|passphrase|secret|secrets|credential|credentials|apikey|secretkey"
    r"|accesskey|privatekey|authkey|authtoken|cookie|signature)$", re.IGNORECASE)
#: ... or is one of these words (``--pass``, ``DB_PW``, ``--pwd``, ``sig=``; ``--bypass``, ``--hotkey`` are not
#: secrets).
_SECRET_WORDS = frozenset({"key", "pass", "pw", "pwd", "sig", "auth", "oauth", "creds", "authorization"})
#: Words that, before ``key`` or ``token``, name something else (``--sort-key``, ``--pad-token``).
_BENIGN_BEFORE = frozenset({
    "store", "cache", "sort", "text", "label", "image", "caption", "prompt", "input", "output", "json", "hash",
    "lookup", "partition", "primary", "foreign", "data", "dataset", "past", "query", "position", "rope", "group",
    "dict", "column", "field", "index", "sequence", "routing", "shard", "row", "map", "pad", "eos", "bos", "unk",
    "sep", "cls", "mask", "special", "max", "num", "start", "end", "stop", "image_token", "kv", "cross"})
_WORDS = re.compile(r"[-_.\s]+|(?<=[a-z0-9])(?=[A-Z])")
#: Environment values shorter than this are not taken as secrets to look for (``KEY=1``).
MIN_KNOWN = 6
_REDIS_SCHEMES = frozenset({"redis", "rediss", "unix"})
#: The shell's working directories: ``pwd`` names no password in them (every path under
#: ``$PWD`` became ``***``: call sites, store names, in the trace and in what reads it).
_SHELL_DIRS = frozenset({"PWD", "OLDPWD"})

_PEM = re.compile(r"(?:-{2,5})?BEGIN ([A-Z0-9 ]*?)PRIVATE KEY((?: BLOCK)?)-{2,5}(.*?)"
                  r"(?:-{2,5}END \1PRIVATE KEY\2-{2,5}|\Z)", re.DOTALL)
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^\s<>`]*)")
_USER = re.compile(r"^[A-Za-z0-9_.~%+-]*$")
# A name and what joins it to its value (the value is read by ``_value_span``):
#: ``name=value``, ``--name=value``, ``name = value`` (not ``==``).
_ASSIGN = re.compile(r"(?<![\w.%-])(-{0,2}[A-Za-z_%][\w.%-]{0,127})[ \t]*=(?!=)[ \t]*")
#: ``"name": value``, ``'name' = value``, ``["name"] = value``, also inside an escaped string (``\"name\"``).
_QUOTED = re.compile(r"""(\\?["'])([\w.% -]{1,128})\1\]?(?::|[ \t]*=(?!=))[ \t]*""")
#: ``'--name', 'value'`` (an argv list's repr: ``CalledProcessError``) and ``('name', 'value')``.
_ITEM = re.compile(r"""(?:(\\?["'])(--?[A-Za-z][\w.-]{0,127})\1|\([ \t]*(\\?["'])([\w.% -]{1,128})\3)[ \t]*,[ \t]*"""
                   r"""(?=[bBuUrR]{0,2}\\?["'])""")
#: ``--password:value``, ``password:value`` (joined by a colon, no space: an option's other
#: spelling, a log's ``key:value``); not ``a.py:42``, ``std::``, ``scheme://``, a URL's ``host:port``.
_JOINED = re.compile(r"(?<![\w.%/:@-])(-{0,2}[A-Za-z_][\w.-]{0,127}):(?![\s:]|//)")
#: ``--name value``: the next word, unless it is plainly an option (``--epochs``, ``-v``).
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w.-]{0,127})[ \t]+(?!--[a-z][a-z0-9-]*(?:\s|$)|-[A-Za-z](?:\s|$))(?=\S)")
#: ``name: value`` starting a line (YAML, .env dumps, config printouts): the rest of the line
#: (HTTP headers are ``_HEADER``'s).
_LINE = re.compile(r"(?m)^[ \t-]*(?!(?i:(?:proxy-)?authorization|(?:set-)?cookie):)([\w.-]{1,128}):[ \t]+(?=\S)")
#: ``{"name": "HF_TOKEN", "value": "…"}``: an environment entry (Kubernetes, Docker).
_ENV_ENTRY = re.compile(r"""(\\?["'])name\1[ \t]*:[ \t]*(\\?["'])([\w.-]{1,128})\2[ \t]*,[ \t]*(\\?["'])value\4"""
                        r"""[ \t]*:[ \t]*""")
#: HTTP headers that carry credentials; an auth scheme's name stays (``Authorization: Bearer ***``).
#: Never right after a '/': that is a URL's user (``https://x-access-token:***@github.com``).
_HEADER = re.compile(r"(?i)(?<!/)\b(?:(?:proxy-)?authorization|x-[\w-]*?(?:key|token|secret|auth)|api-key|((?:set-)?cookie))"
                     r":[ \t]*(?:(bearer|basic|token|digest|negotiate|ntlm)[ \t]+)?(?=\S)")
#: ``Bearer …``/``Basic …`` outside a header (``Token`` only in one: it is an English word).
_SCHEME_AUTH = re.compile(r"(?i)\b(?:bearer|basic)\s+(?!-)([A-Za-z0-9._~+/=-]{8,})")
_AWS_ID = r"(?<![A-Z0-9])(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|ABIA|ACCA)([A-Z0-9]{16})(?![A-Z0-9])"
#: An AWS secret access key after its key id (``AKIA… wJalr…``, ``('AKIA…', 'wJalr…')``): 40
#: characters of base64 holding both cases, within 40 characters of the id (it has no shape alone).
_AWS_SECRET = re.compile(r"[^\n]{0,40}?(?<![A-Za-z0-9/+=])([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])")
#: Token shapes: (a substring every match holds, the pattern; group 1 is what is hidden).
_SHAPES: tuple[tuple[str, re.Pattern], ...] = tuple((gate, re.compile(p)) for gate, p in (
    ("hf_", r"(?<![A-Za-z0-9])hf_([A-Za-z0-9]{16,})"),  # (in a name too: ``run_hf_…``)
    ("sk-", r"(?<![A-Za-z0-9_-])sk-((?=[A-Za-z0-9_-]*\d)[A-Za-z0-9][A-Za-z0-9_-]{15,})"),
    ("k_", r"(?<![A-Za-z0-9_-])(?:sk|rk)_(?:live|test)_([A-Za-z0-9]{16,})"),
    ("_", r"(?<![A-Za-z0-9])gh[pousr]_([A-Za-z0-9]{16,})"),
    ("npm_", r"(?<![A-Za-z0-9])npm_([A-Za-z0-9]{30,})"),
    ("ya29.", r"(?<![A-Za-z0-9])ya29\.([A-Za-z0-9_-]{20,})"),
    ("github_pat_", r"github_pat_([A-Za-z0-9_]{16,})"),
    ("gl", r"(?<![A-Za-z0-9_-])gl(?:pat|dt)-([A-Za-z0-9_-]{16,})"),
    ("x", r"(?<![A-Za-z0-9])(?:xox[abposre]|xapp)-([A-Za-z0-9-]{10,})"),
    ("A", _AWS_ID),
    ("ZXIvYXdz", r"FwoGZXIvYXdz([A-Za-z0-9/+=]{16,})"),  # AWS session tokens (base64 of their header)
    ("b3JpZ2lu", r"IQoJb3JpZ2lu([A-Za-z0-9/+=]{16,})"),
    ("AIza", r"AIza([0-9A-Za-z_-]{30,})"),
    ("eyJ", r"(?<![A-Za-z0-9_-])eyJ([A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*)"),
    ("hooks.slack.com", r"hooks\.slack\.com/services/[A-Za-z0-9]+/[A-Za-z0-9]+/([A-Za-z0-9]{8,})"),
    ("pypi-", r"(?<![A-Za-z0-9_-])pypi-(AgE[A-Za-z0-9_-]{16,})"),  # (a macaroon: base64 of its location)
    ("dapi", r"(?<![A-Za-z0-9])dapi([0-9a-f]{32})(?![0-9a-f])"),  # Databricks
    ("dckr_pat_", r"(?<![A-Za-z0-9])dckr_pat_([A-Za-z0-9_-]{20,})"),  # Docker Hub
    ("hv", r"(?<![A-Za-z0-9])hv[sbr]\.([A-Za-z0-9_-]{24,})"),  # HashiCorp Vault
))
_AWS_PATTERN = next(p for _, p in _SHAPES if p.pattern == _AWS_ID)
#: ``curl -u user:password``, ``--user``, ``--proxy-user`` (``-uuser:pw`` too): the password.
#: Not a uid:gid (``docker run -u 1000:1000``), a URL (its ``_url_spans``), nor ``python -u
#: train.py`` (no colon).
#: An argv list's repr too (``'-u', 'user:pw'``: ``CalledProcessError``).
_USER_OPTION = re.compile(r"""(?<![\w-])(?:-u|-U|--user|--proxy-user)(?:\\?["'])?[ \t]*[=,]?[ \t]*\\?["']?"""
                          r"""([^\s:'"\\,]+):(?!//)([^\s'"\\]+)""")


class ToolPassword(NamedTuple):
    """A program whose short flag takes a password (elsewhere ``-p`` is a port, ``-a`` all)."""

    program: re.Pattern  # the program, where a text (or a command line's first words) names it
    flag: str
    apart: bool  # the value may be the next word (``sshpass -p pw``), not only joined (``mysql -ppw``)
    pattern: re.Pattern  # the flag, up to its value


def _tool(program: str, flag: str, apart: bool) -> ToolPassword:
    # joined (``-pSECRET``, ``-p=SECRET``); apart: the next word, or an argv list's next item (``'-p', 'pw'``)
    sep = r"(?:[ \t]+(?=\S)|(\\?[\"'])[ \t]*,[ \t]*(?=[bBuUrR]{0,2}\\?[\"'])|(?=\S))" if apart else r"(?=\S)"
    return ToolPassword(re.compile(program), flag, apart, re.compile(rf"(?<![\w-]){flag}{sep}"))


#: ``mysql -pSECRET`` (MySQL's ``-p`` takes no next word: ``-p db`` asks for it), ``sshpass -p``,
#: ``redis-cli -a``, ``docker login -p``, the MongoDB tools' ``-p``, ``7z -p``, ``zip -P``,
#: ``ldapsearch -w``, ``sqlcmd -P``, ``mosquitto_pub -P``: where the text names the program.
_TOOLS = (
    _tool(r"(?i)\b(?:mysql\w*|mariadb\w*)\b", "-p", False),
    _tool(r"\bsshpass\b", "-p", True),
    _tool(r"\bredis-cli\b", "-a", True),
    _tool(r"\b(?:docker|podman|nerdctl|buildah|skopeo)(?:[ \t]+|\\?[\"'],[ \t]*\\?[\"'])login\b", "-p", True),
    _tool(r"\bmongo(?:sh|dump|restore|export|import|stat|top|files)?\b", "-p", True),
    _tool(r"\b(?:7z[ar]?|(?:un)?rar)\b", "-p", False),
    _tool(r"\b(?:un)?zip\b", "-P", True),
    _tool(r"\bldap(?:search|add|modify|delete|passwd|compare|whoami|modrdn)\b", "-w", True),
    _tool(r"\b(?:sqlcmd|bcp|mosquitto_pub|mosquitto_sub)\b", "-P", True),
)
_CLOSERS = ",;)]}>'\""
_BARE = re.compile(r"\S*")
_BARE_QUERY = re.compile(r"[^\s&;#'\"<>]*")
_LINE_REST = re.compile(r"[^\r\n]*")
_STRING_START = re.compile(r"""[bBuUrRfF]{0,2}(\\?["'])""")
_CALL_START = re.compile(r"[A-Za-z_][\w.]{0,64}\(")
_IN_QUOTES = {'"': re.compile(r'(?:\\.|[^\\"\n])*'), "'": re.compile(r"(?:\\.|[^\\'\n])*")}
#: Values no secret has: constants, special tokens (``<pad>``, ``</s>``, ``[PAD]``,
#: ``<|endoftext|>``); a small number under ``sig``, an absolute path under ``key`` (``_plain``).
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_NOT_SECRET = re.compile(r"None|True|False|null|true|false|<[^<>\s]{1,40}>|\[[A-Z]{1,12}\]|<\|[^|\s]{1,40}\|>")
_BRACKETS = {"(": ")", "[": "]", "{": "}"}
_SCAN = 4096  # the furthest a value's closing quote or bracket is looked for
_CACHE_TEXT = 512  # texts up to this long (call sites, frames) are remembered
_CACHE_SIZE = 1 << 16

Span = tuple[int, int]


def _last_word(name: str) -> tuple[str, str]:
    """(the last word of a name, lower case; the word before it)."""
    name = name.lstrip("-")
    if "%" in name:
        try:
            name = unquote_plus(name)
        except Exception:
            pass
    words = [w.lower() for w in _WORDS.split(name) if w]
    if not words:
        return "", ""
    return words[-1], words[-2] if len(words) > 1 else ""


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """Whether an argument, variable or key of this name holds a secret: its last word
    ends in a secret's word (token, password, secret, credential ...) or is one (key, pass,
    pw, auth, sig), and is not a known other thing (``sort-key``, ``pad-token``)."""
    last, before = _last_word(name)
    if not last:
        return False
    if last in ("key", "token") and before in _BENIGN_BEFORE:
        return False
    # (a secret's word split in two: ``PassWord``, ``Pass%57ord``, ``pass_phrase``)
    return (last in _SECRET_WORDS or _SECRET_SUFFIX.search(last) is not None
            or (before != "" and _SECRET_SUFFIX.search(before + last) is not None))


def _url_spans(text: str, out: list[Span]) -> None:
    """The user info (or its password) of every URL: up to the URL's last '@' when a
    password holds an unencoded '/', '?', '#' or '@'.  After a host and its port, what lies
    before a later '@' may be a query or another string (``host:80/?mail=a@b``, ``","x@y``):
    taken as user info only where it does not look like one."""
    for m in _URL.finditer(text):
        run, base = m.group(2), m.start(2)
        last = run.rfind("@")
        if last <= 0:
            continue
        cut = len(run)
        for sep in "/?#":
            i = run.find(sep)
            if 0 <= i < cut:
                cut = i
        netloc = run[:cut]
        if not netloc and m.group(1).lower() in ("redis", "rediss"):  # (a mistyped ``redis:///:pw@host``)
            lead = len(run) - len(run.lstrip("/"))
            if last > lead:
                out.append((base + lead, base + last))
            continue
        between = run[cut:last]
        query = between.find("?")  # (what holds an '=' after a '?' is a query: ``host:80/x?mail=a@b``)
        odd = (not any(c in between for c in "\"' ") and not (query >= 0 and "=" in between[query:])
               and run[last - 1] != "/")
        after = netloc.rpartition(":")[2]  # a port, or where a password cut at its '/', '?' or '#' starts
        if "@" in netloc:
            at = last if last > cut and odd else netloc.rfind("@")
        elif ":" in netloc and not netloc.startswith("[") and (odd or not after.isdigit() or netloc[0] == ":"):
            # user:pass with an unencoded '/', '?' or '#': where what follows the ':' is no
            # port, whatever lies between (base64's '=' in ``Xy3/kP9+ab==``, a last '/'), or
            # where no host comes before it (``redis://:12345/@host``: a password of digits
            # that ends in '/'; ``host:443/@alice`` is a path)
            at = last
        else:
            continue
        user, colon, password = run[:at].partition(":")
        if colon and _USER.match(user):
            if password:
                out.append((base + len(user) + 1, base + at))
        elif colon or m.group(1).lower() in _REDIS_SCHEMES or _token_like(user):
            out.append((base, base + at))  # redis://secret@host: a bare user info is the password


def _password_name(name: str) -> bool:
    """A name whose value is a password whatever it looks like (``COMMSCOPE_REDIS_PASSWORD``
    holding ``/xK9…``), not a path to one's file (``GOOGLE_APPLICATION_CREDENTIALS``)."""
    return _last_word(name)[0] in ("password", "passwd", "passphrase", "pass", "pw", "pwd")


def _token_like(word: str) -> bool:
    return len(word) >= 16 and any(c.isdigit() for c in word) and any(c.isalpha() for c in word)


def _credential_like(word: str) -> bool:
    """Not an English word: a digit, an upper-case letter past the first, or base64's + / =."""
    return any(c.isdigit() or c in "+/=" for c in word) or any(c.isupper() for c in word[1:])


def _closing(text: str, start: int, close: str) -> int:
    """Where the bracket opened just before ``start`` closes (-1: not within ``_SCAN``)."""
    limit = min(len(text), start + _SCAN)
    if text.find(close, start, limit) < 0:
        return -1
    depth, i = 1, start
    while i < limit:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c in "\"'":
            m = _IN_QUOTES[c].match(text, i + 1, limit)
            i = m.end() + 1
            continue
        if c in _BRACKETS:
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _value_span(text: str, start: int, *, query: bool = False, line: bool = False) -> Span:
    """The value starting at ``start``: a string literal's contents (``b'…'``, ``"…"``, an
    escaped ``\\"…\\"``), a bracketed or called value whole (``('u', 'pw')``,
    ``SecretStr('…')``), else the word (in a query, up to ``&``; with ``line``, the line)."""
    m = _STRING_START.match(text, start)
    if m is not None:
        quote = m.group(1)
        body = m.end()
        if len(quote) == 1:
            if text.startswith(quote * 2, body):  # a triple-quoted string (``"""…"""``), not an empty one
                close = text.find(quote * 3, body + 2, body + 2 + _SCAN)
                return body + 2, close if close >= 0 else _LINE_REST.match(text, body + 2).end()
            limit = min(len(text), body + _SCAN)
            end = _IN_QUOTES[quote].match(text, body, limit).end()
            if end == limit < len(text):  # not closed within the scan: the rest of the line, not a tail kept
                end = _LINE_REST.match(text, end).end()
        else:  # an escaped quote inside another string: up to the next escaped one
            end = text.find(quote, body, body + _SCAN)
            end = end if end >= 0 else _BARE.match(text, body).end()
        return body, end
    if start < len(text) and text[start] in _BRACKETS:
        close = _closing(text, start + 1, _BRACKETS[text[start]])
        if close >= 0:
            return start, close + 1
    call = _CALL_START.match(text, start)
    if call is not None:
        close = _closing(text, call.end(), ")")
        if close >= 0:
            return start, close + 1
    if line:
        end = _LINE_REST.match(text, start).end()
        while end > start and text[end - 1] in " \t":
            end -= 1
        return start, end
    end = (_BARE_QUERY if query else _BARE).match(text, start).end()
    if not query:
        while end > start and text[end - 1] in _CLOSERS:
            end -= 1
    return start, end


def _plain(value: str, name: str) -> bool:
    """A value no secret has (``None``, ``<pad>``; a number under a key or token name)."""
    if _NOT_SECRET.fullmatch(value):
        return True
    last = _last_word(name)[0]
    if last == "sig":
        return len(value) <= 4 and _NUMBER.fullmatch(value) is not None  # a signal's number (``sig=15``)
    if last == "key":
        return value.startswith("/")  # a path, a c10d store key (``key=/default_pg/0//nccl``)
    return False


def _named_spans(text: str, out: list[Span], hard: list[Span], pattern: re.Pattern, name: int, **how: bool) -> None:
    """The values ``pattern`` joins to a secret's name (group ``name``)."""
    hidden_to = -1
    walls = sorted(hard)
    wall = 0
    for m in pattern.finditer(text):
        pos = m.start()
        while wall < len(walls) and walls[wall][1] <= pos:
            wall += 1
        if pos < hidden_to or (wall < len(walls) and walls[wall][0] <= pos):
            continue  # inside a value already hidden: never walked again (hostile text stays near-linear)
        key = m.group(name)
        if key is None or not is_secret_name(key):
            continue
        query = pattern is _ASSIGN and m.start() > 0 and text[m.start() - 1] in "?&;"
        s, e = _value_span(text, m.end(), query=query, **how)
        if e > s and (query or not _plain(text[s:e], key)):
            out.append((s, e))
            hidden_to = e


_OPTION_NAME = re.compile(r"--?[A-Za-z][\w.-]*")
#: What follows a flag that takes no value: another option, plainly (a password may start with '-').
_PLAIN_OPTION = re.compile(r"--[a-z][a-z0-9-]*|-[A-Za-z]")


class Redactor:
    """Finds the spans of text that hold a credential; ``known``: values to hide wherever
    they appear (the environment's secrets)."""

    def __init__(self, known: Iterable[str] = ()):
        self.known = tuple(sorted({k for k in known if len(k) >= MIN_KNOWN}, key=len, reverse=True))
        self._cache: dict[str, str] = {}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Redactor:
        """The values of variables named like secrets (``WANDB_API_KEY``, ``HF_TOKEN``), but
        paths (``GOOGLE_APPLICATION_CREDENTIALS`` names a file, not a secret)."""
        return cls(v for k, v in environ.items()
                   if is_secret_name(k) and k not in _SHELL_DIRS
                   and (not v.startswith(("/", "~", ".")) or _password_name(k)))

    def spans(self, text: str) -> list[Span]:
        """The (start, end) ranges to hide, sorted and merged."""
        out: list[Span] = []
        hard: list[Span] = []  # private keys and URL user info: no other rule starts inside them
        if "PRIVATE KEY" in text:
            hard.extend(m.span(3) for m in _PEM.finditer(text) if m.end(3) > m.start(3))
        if "://" in text:
            _url_spans(text, hard)
        out.extend(hard)
        if "=" in text:
            _named_spans(text, out, hard, _ASSIGN, 1)
        if "'" in text or '"' in text:
            if ":" in text or "=" in text:
                _named_spans(text, out, hard, _QUOTED, 2)
                if "value" in text:
                    _named_spans(text, out, hard, _ENV_ENTRY, 3)
            if "," in text:
                _named_spans(text, out, hard, _ITEM, 2)
                _named_spans(text, out, hard, _ITEM, 4)
        if "-" in text and (" " in text or "\t" in text):
            _named_spans(text, out, hard, _OPTION, 1)
        if ":" in text:
            _named_spans(text, out, hard, _JOINED, 1)
            _named_spans(text, out, hard, _LINE, 1, line=True)
            for m in _HEADER.finditer(text):  # a cookie or a digest's fields: the line; else one word
                whole = m.group(1) is not None or (m.group(2) or "").lower() == "digest"
                out.append(_value_span(text, m.end(), line=whole))
        if ":" in text and ("-u" in text or "-U" in text or "-user" in text):
            out.extend(m.span(2) for m in _USER_OPTION.finditer(text)
                       if not (m.group(1).isdigit() and m.group(2).isdigit()))
        for tool in _TOOLS:
            if tool.flag in text and tool.program.search(text) is not None:
                hidden_to = -1
                for m in tool.pattern.finditer(text):
                    if m.start() >= hidden_to:  # (a flag inside a value already hidden is not walked again)
                        s, hidden_to = _value_span(text, m.end())
                        out.append((s, hidden_to))
        if "earer" in text or "asic" in text or "EARER" in text or "ASIC" in text:
            out.extend(m.span(1) for m in _SCHEME_AUTH.finditer(text) if _credential_like(m.group(1)))
        for gate, pattern in _SHAPES:
            if gate in text:
                for m in pattern.finditer(text):
                    out.append(m.span(1))
                    if pattern is _AWS_PATTERN:
                        pair = _AWS_SECRET.match(text, m.end(), m.end() + 81)
                        if pair is not None and not pair.group(1).islower() and not pair.group(1).isupper():
                            out.append(pair.span(1))
        for value in self.known:
            at = text.find(value)
            while at >= 0:
                out.append((at, at + len(value)))
                at = text.find(value, at + len(value))
        if len(out) < 2:
            return out
        out.sort()
        merged = [out[0]]
        for s, e in out[1:]:
            ls, le = merged[-1]
            if s <= le:
                merged[-1] = (ls, max(le, e))
            else:
                merged.append((s, e))
        return merged

    def redact(self, text: str) -> str:
        """``text`` with every credential replaced by ``***``."""
        short = len(text) <= _CACHE_TEXT
        if short:
            hit = self._cache.get(text)
            if hit is not None:
                return hit
        spans = self.spans(text)
        out = text
        if spans:
            parts, last = [], 0
            for s, e in spans:
                parts.append(text[last:s])
                parts.append(MARK)
                last = e
            parts.append(text[last:])
            out = "".join(parts)
        if short:
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.clear()
            self._cache[text] = out
        return out

    def mask(self, data: bytes) -> bytes:
        """``data`` (UTF-8) with every credential's bytes replaced by ``*``, its length
        unchanged: text inside packed records is hidden in place."""
        text = data.decode("utf-8", "surrogateescape")
        spans = self.spans(text)
        if not spans:
            return data
        parts, last = [], 0
        for s, e in spans:
            parts.append(text[last:s].encode("utf-8", "surrogateescape"))
            parts.append(b"*" * len(text[s:e].encode("utf-8", "surrogateescape")))
            last = e
        parts.append(text[last:].encode("utf-8", "surrogateescape"))
        return b"".join(parts)

    def args(self, argv: Sequence[str]) -> list[str]:
        """A command line safe to record: each argument redacted, and the word after an
        option that names a secret (``--password hunter2``) hidden whole."""
        out = [self.redact(a) for a in argv]
        named = " ".join([os.path.basename(argv[0]), *argv[1:2]]) if argv else ""  # (``docker login``)
        tools = [t for t in _TOOLS if t.program.match(named) is not None]
        for i in range(len(argv)):
            a = argv[i]
            for tool in tools:  # (a program's password flag: mysql -pSECRET, sshpass -p SECRET)
                if len(a) > 2 and a.startswith(tool.flag):
                    out[i] = tool.flag + MARK
                elif a == tool.flag and tool.apart and i + 1 < len(argv) and not _PLAIN_OPTION.fullmatch(argv[i + 1]):
                    out[i + 1] = MARK
            if i + 1 == len(argv):
                break
            nxt = argv[i + 1]
            if (_OPTION_NAME.fullmatch(a) and is_secret_name(a) and nxt and not _PLAIN_OPTION.fullmatch(nxt)
                    and not _plain(nxt, a)):
                out[i + 1] = MARK
            elif a in ("-u", "-U", "--user", "--proxy-user") and ":" in nxt:  # (curl's user:password)
                user, _, password = nxt.partition(":")
                if password and not (user.isdigit() and password.isdigit()):
                    out[i + 1] = f"{self.redact(user)}:{MARK}"
        return out


_default: Redactor | None = None


def default() -> Redactor:
    """This process's redactor (it knows the environment's secrets), made on first use."""
    global _default
    if _default is None:
        _default = Redactor.from_environ(os.environ)
    return _default


def redact(text: str) -> str:
    """``text`` with every credential replaced by ``***`` (see the module docstring)."""
    return default().redact(text)


def known_texts() -> dict[str, str]:
    """The default redactor's memo (short text -> redacted), for a reader's inner loop to
    look a call site up without a call; a miss goes to ``redact``."""
    return default()._cache


def redact_args(argv: Sequence[str]) -> list[str]:
    """A command line safe to record (``meta.argv``)."""
    return default().args(argv)


def mask(data: bytes) -> bytes:
    """``data`` with every credential's bytes replaced by ``*``, its length unchanged."""
    return default().mask(data)
