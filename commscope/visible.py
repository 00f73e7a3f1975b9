"""Text from a trace made safe to show on a terminal: its control characters made visible.

A trace is read from a store that whoever could write to it filled, so a host, a group, an
op's name, a call site or an exception's text may hold a terminal's control sequences:
ESC [ 2 J clears the screen, ESC ] 0 sets the window's title, ESC ] 52 writes the
clipboard, and C1's CSI (U+009B) is ESC [ in one character.  Neither rich nor Textual
removes ESC from the text it draws (they drop BEL, BS, VT, FF and CR), so ``commscope
check`` and the console passed them on.  The readers make them visible where they decode
text, as they redact credentials there: every string of a decoded event
(``schema``), and the strings of the binary records (``blocks``: sites, groups, exception
texts, a begin's JSON fragment).  A control character is shown as its escape (``\\x1b``),
so what the trace held stays readable; a tab, a newline and a carriage return stay as they
are (rich and Textual drop a carriage return where they draw; a group named "g\\r" stays
apart from "g").

Unicode's bidirectional formatting characters are shown so too (``\\u202e``): an
override (RLO, U+202E) or an isolate (U+2066-U+2069) makes a terminal draw the text after
it in another order than it is held ("Trojan Source"), so a call site or an op's name
could read as another one.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["may_hold_control", "visible", "visible_event"]

#: C0 but tab, newline and carriage return, DEL, C1; the bidirectional marks, embeddings,
#: overrides and isolates (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069)
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: those above DEL as UTF-8 writes them
_HIGH_UTF8 = re.compile(b"\xc2[\x80-\x9f]|\xd8\x9c|\xe2\x80[\x8e\x8f\xaa-\xae]|\xe2\x81[\xa6-\xa9]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: str) -> str:
    """``text`` with its control characters shown as escapes (``\\x1b``); the same string
    where it has none."""
    return text if _CONTROL.search(text) is None else _CONTROL.sub(_escape, text)


def _value(v: Any) -> Any:
    """A decoded JSON value with its strings ``visible``, its containers new (a list the
    decoder shares between events, a meta's op names, is never written)."""
    if isinstance(v, str):
        return visible(v)
    if isinstance(v, list):
        return [_value(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_value(x) for x in v)
    if isinstance(v, dict):
        return {visible(k) if isinstance(k, str) else k: _value(x) for k, x in v.items()}
    return v


def visible_event(e: dict) -> dict:
    """``e`` (a decoded event) with every string in it ``visible``, keys too, in place (the
    event stays the object it was: readers keep them by identity); returns ``e``."""
    for key in list(e):
        value = e[key]
        shown = visible(key) if isinstance(key, str) else key
        if shown is not key:
            del e[key]
        e[shown] = _value(value)
    return e


def may_hold_control(data: bytes) -> bool:
    """Whether JSON text ``data`` may decode to a string holding a control character: an
    escape that can name one (``\\u00..``, ``\\u06..``, ``\\u20..``, ``\\b``,
    ``\\f``), or DEL, a C1 character or a bidirectional one written as it is (JSON allows
    them; C0 written as it is is not JSON).  A few passes of ``memchr``: a read's JSON lines
    almost never do, and walking every string of every event would cost more than decoding
    them."""
    if b"\\" in data and (b"\\u00" in data or b"\\b" in data or b"\\f" in data or b"\\u20" in data
                         or b"\\u06" in data):
        return True
    if b"\x7f" in data:
        return True
    return (b"\xc2" in data or b"\xe2" in data or b"\xd8" in data) and _HIGH_UTF8.search(data) is not None
