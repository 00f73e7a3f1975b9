"""Stores as a registry of backends (``store/registry.py``): a backend is one module plus
one row, its writers say what the recorder asks of them, and no store's credentials reach
what is shown or recorded."""

from __future__ import annotations

import subprocess
import sys

from trace_helpers import missing_members, protocol_members

from commscope.store import redact_store
from commscope.store.base import StoreWriter
from commscope.store.directory import DirectoryWriter
from commscope.store.redis_store import RedisWriter


def test_every_writer_has_what_the_recorder_asks_of_it():
    members = protocol_members(StoreWriter)
    assert {"write", "close", "job", "stored", "first_event", "crash_dir"} <= members
    for writer in (DirectoryWriter, RedisWriter):
        missing = missing_members(writer, StoreWriter)
        assert not missing, (writer.__name__, missing)


def test_a_stores_credentials_never_reach_its_shown_name():
    assert redact_store("redis://:hunter2@db:6379/0?job=j") == "redis://:***@db:6379/0?job=j"
    assert redact_store("REDIS://user:hunter2@db:6379/0").count("hunter2") == 0  # the scheme, in any case
    assert redact_store("/tmp/trace") == "/tmp/trace"


_MEM_BACKEND = r'''
"""A third backend, kept in this process's memory: one module."""
from commscope.store.base import ReadStats, TraceReader

STREAMS: dict[tuple[str, str, int], list[bytes]] = {}
JOBS: dict[str, str] = {}


class MemWriter:
    crash_dir = None
    write_every = 0.0

    def __init__(self, name, job, rank, job_meta=None, *, incarnation=0, resume=False, connect_timeout=None,
                 share=None):
        self.name, self.job, self.rank, self.description = name, job, rank, f"{name} rank {rank}"
        self.lines = STREAMS.setdefault((name, job, rank), [])
        JOBS[name] = job

    @property
    def stored(self):
        return len(self.lines)

    def write(self, lines):
        self.lines.extend(lines)

    def first_event(self):
        return None

    def close(self):
        pass


class MemReader(TraceReader):
    def __init__(self, name, *, wait=False):
        self.name, self.description, self.stats, self.done = name, name, ReadStats(), {}

    def poll(self, max_bytes=None):
        out = []
        job = JOBS.get(self.name)
        for (name, j, rank), lines in sorted(STREAMS.items()):
            if (name, j) != (self.name, job):
                continue
            new = lines[self.done.get(rank, 0):]
            self.done[rank] = len(lines)
            if new:
                raw = b"\n".join(new) + b"\n"
                out += self.ingest((rank, 0), raw, len(raw)).events
        return out
'''

_ONE_ROW = r'''
import importlib.abc, importlib.util, sys
from pathlib import Path

import commscope
path = Path(commscope.__file__).parent / "store" / "registry.py"
text = path.read_text()
tail = "BACKENDS: tuple[Backend, ...] = (DIRECTORY, REDIS)"
assert tail in text
row = ('MEM = Backend(name="mem", schemes=("mem",), writer=_late("memstore", "MemWriter"), '
       'reader=_late("memstore", "MemReader"), local=False, redact=redact_text, identity=_same, '
       'job_location=lambda name, job: f"{name} job {job}")\n')
text = text.replace(tail, row + "BACKENDS: tuple[Backend, ...] = (DIRECTORY, REDIS, MEM)")


class WithRow(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Loads commscope.store.registry from ``text``: the row, added in one place."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == "commscope.store.registry" else None

    def exec_module(self, module):
        exec(compile(text, str(path), "exec"), module.__dict__)


assert "commscope.store" not in sys.modules
sys.meta_path.insert(0, WithRow())
from commscope import events
from commscope.store import open_reader, open_writer, redact_store

name = "mem://user:hunter2@box/"
w = open_writer(name, "job1", 0, {"world_size": 1})
w.write([events.encode({"type": "meta", "v": 1, "rank": 0, "ts": 1, "job": "job1", "world_size": 1,
                        "store": redact_store(name)}),
         events.encode({"type": "exit", "v": 1, "rank": 0, "ts": 2, "reason": "destroy_process_group"})])
got = open_reader(name).read_all()
assert [e["type"] for e in got] == ["meta", "exit"], got
assert "hunter2" not in got[0]["store"], got[0]["store"]
print("one module and one row")
'''


def test_a_backend_is_one_module_and_one_row(tmp_path):
    """A third backend (a module of the test's, and one row added to ``BACKENDS``) is
    written and read through ``open_writer`` / ``open_reader``, its name redacted, with
    nothing else edited."""
    (tmp_path / "memstore.py").write_text(_MEM_BACKEND)
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" + _ONE_ROW],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "one module and one row"
