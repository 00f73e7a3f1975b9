"""A trace's text never sends a terminal control sequence: a host, a group, an op's name, a
call site, an exception's text or a stack that holds ESC (or C1's CSI, BEL ...) is shown
with it made visible (``\\x1b``), by every command and by the console, whichever way it was
written (JSON events, a native block's records, a begin's JSON fragment, job metadata).
Neither rich nor Textual removes ESC: ``check`` passed "ESC ] 52" (write the clipboard) and
"ESC [ 2 J" (clear the screen) from a trace straight to the user's terminal."""

from __future__ import annotations

import json
import re
from pathlib import Path

from test_secrets import outputs, replay_texts
from trace_helpers import read_events

from commscope import blocks
from commscope.store import open_reader
from commscope.visible import may_hold_control, visible

#: What a hostile (or only odd) trace may say: clear the screen, set the title, write the
#: clipboard, C1's CSI, a bell, DEL
CLEAR, TITLE, CLIP = "\x1b[2J", "\x1b]0;owned\x07", "\x1b]52;c;aGVsbG8=\x1b\\"
#: What reorders what a terminal draws ("Trojan Source"): a right-to-left override, an isolate
RLO, RLI = "\u202e", "\u2067"
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def test_visible_shows_control_characters_as_escapes():
    assert visible("a\x1b[2Jb\tc\nd\r\x9b1\x7f\x00") == "a\\x1b[2Jb\tc\nd\r\\x9b1\\x7f\\x00"  # (CR: drawn as nothing)
    clean = "all_reduce at train.py:12 in step\t(µs, °C)\n"
    assert visible(clean) is clean
    assert may_hold_control(b'{"exc":"a \\u001b[2J"}') and may_hold_control(b'{"x":"\\u001B"}')
    assert may_hold_control(b'{"x":"\\b"}') and not may_hold_control(b'{"x":"\\r\\n\\t"}')
    assert may_hold_control('{"x":"\x9b"}'.encode()) and may_hold_control(b'{"x":"\x7f"}')
    assert not may_hold_control('{"site":"train.py:3 in step","t":"5 µs, 3 °C"}'.encode())
    assert visible("f\u202eolleh\u202c \u2067x\u2069\u200f\u061c") == "f\\u202eolleh\\u202c \\u2067x\\u2069\\u200f\\u061c"
    for bidi in ("\u202e", "\u202a", "\u2066", "\u2069", "\u200e", "\u061c"):
        assert may_hold_control(f'{{"site":"a{bidi}b"}}'.encode())
        assert may_hold_control(f'{{"site":"a\\u{ord(bidi):04X}b"}}'.encode())
    assert not may_hold_control('{"site":"a – b … “c” ‰ ؛"}'.encode())  # (U+2013, U+2026, U+201C, U+2030, U+061B)


def hostile_store(root: Path) -> str:
    """Two ranks: rank 0 native (blocks: a site, a group, an exception, a begin's JSON
    fragment; its meta's op names), rank 1 JSON events (host, group, site, exception, stack,
    argv, a GPU probe's error), and the job's metadata."""
    job = root / "j"
    job.mkdir(parents=True)
    (root / "LATEST").write_text("j\n")
    (job / "job.json").write_text(json.dumps({"job": f"j{TITLE}", "world_size": 2}))
    fragment = json.dumps({"op": f"broad{CLEAR}cast", "group": "0", "root": 0}).encode()[1:-1]
    recs = (blocks.pack_site(0, f"train.py:3 in {CLIP}step{RLO}pets")
            + blocks.pack_group(1, f"tp{CLEAR}", "gloo", [0, 1])
            + blocks.pack_begin(1, 2_000, name=0, site=0, seq=1, ins=[(6, [4])], outs=[(6, [4])], in_bytes=16,
                                out_bytes=16)
            + blocks.pack_end(1, 3_000, exc=f"RuntimeError: {CLEAR}bad\x9b2J")
            + blocks.pack_rbegin(2, 4_000, fragment))
    lines = {
        0: [{"type": "meta", "rank": 0, "ts": 1, "v": 3, "world_size": 2, "backend": "gloo", "recorder": "native",
             "names": [f"all_{TITLE}reduce"], "host": f"node{CLEAR}0{RLO}"},
            {"type": "group", "rank": 0, "ts": 1, "v": 3, "group": "0", "gid": 0, "granks": [0, 1]},
            json.loads(blocks.encode_block(recs, 0, 5_000, blocks.count_records(recs)))],
        1: [{"type": "meta", "rank": 1, "ts": 1, "v": 3, "world_size": 2, "backend": "gloo",
             "host": f"node{TITLE}1", "argv": ["train.py", f"--run={CLIP}"]},
            {"type": "group", "rank": 1, "ts": 1, "v": 3, "group": f"g{CLEAR}", "granks": [0, 1]},
            {"type": "op", "rank": 1, "ts": 2_000, "v": 3, "phase": "begin", "id": 1, "op": "all_reduce",
             "group": f"g{CLEAR}", "seq": 1, "in_shapes": [[4]], "in_dtypes": ["float32"], "in_bytes": 16,
             "out_shapes": [[4]], "out_dtypes": ["float32"], "out_bytes": 16, "site": f"x.py:1 in {TITLE}f"},
            {"type": "stack", "rank": 1, "ts": 8_000, "v": 3, "id": 1, "threads": [
                {"tid": 1, "name": f"main{CLEAR}", "op_thread": True,
                 "frames": [["train.py", 3, "main"], [f"/tmp/{CLIP}x.py", 9, f"fetch{CLEAR}"]]}]},
            {"type": "sample", "rank": 1, "ts": 8_500, "v": 3, "cpu": 1.0, "rss": 1,
             "gpu_error": f"nvml \x07{CLEAR}\x7f"},
            {"type": "exit", "rank": 1, "ts": 9_000, "v": 3, "reason": "exception",
             "exc": f"ValueError: {CLIP} \x9b2J done {RLI}x"}],
    }
    for rank, evs in lines.items():  # (rank 1's text as UTF-8, not escaped: C1 and DEL as they are)
        (job / f"rank-{rank:05d}.jsonl").write_bytes(b"".join(
            json.dumps(e, ensure_ascii=rank == 0).encode() + b"\n" for e in evs))
    assert "\x9b".encode() in (job / "rank-00001.jsonl").read_bytes()
    return str(root)


def strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*strings(k), *strings(v))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in strings(v)]
    return []


def test_a_traces_control_characters_are_made_visible_where_it_is_read(tmp_path):
    store = hostile_store(tmp_path / "t")
    reader = open_reader(store)
    assert (reader.job() or {}).get("job") == "j\\x1b]0;owned\\x07"  # (job.json, which copy carries over)
    reader.close()
    events = read_events(store)
    held = [s for e in events for s in strings(e) if CONTROL.search(s)]
    assert not held, held[:5]
    text = "\n".join(s for e in events for s in strings(e))
    for shown in ("node\\x1b[2J0\\u202e", "node\\x1b]0;owned\\x071", "train.py:3 in \\x1b]52;c;aGVsbG8=\\x1b\\step\\u202epets",
                  "tp\\x1b[2J", "RuntimeError: \\x1b[2Jbad\\x9b2J", "broad\\x1b[2Jcast", "all_\\x1b]0;owned\\x07reduce",
                  "g\\x1b[2J", "x.py:1 in \\x1b]0;owned\\x07f", "fetch\\x1b[2J", "nvml \\x07\\x1b[2J\\x7f",
                  "ValueError: \\x1b]52;c;aGVsbG8=\\x1b\\ \\x9b2J done \\u2067x", "--run=\\x1b]52;c;aGVsbG8=\\x1b\\"):
        assert shown in text, shown


def test_no_command_and_no_console_pane_sends_a_trace_control_sequence(tmp_path, capsys):
    store = hostile_store(tmp_path / "t")
    shown = outputs(store, tmp_path, capsys)
    for what, text in shown.items():
        assert not CONTROL.search(text), (what, CONTROL.findall(text)[:5])
        assert "\\u001b" not in text and "\\u009b" not in text, what  # (a JSON output's escape of one)
    assert "RuntimeError: \\x1b[2Jbad\\x9b2J" in shown["check"].replace("\n", "").replace("│", "")
    assert "\\\\x1b" in shown["check --json"]  # (JSON's escape of the backslash that shows it)
    for text in replay_texts(store):
        assert not CONTROL.search(text), CONTROL.findall(text)[:5]


def test_a_snapshot_prints_a_stack_s_paths_without_their_control_sequences(capsys):
    """``commscope snapshot`` prints where each rank is, from py-spy's stacks of processes
    it did not start: a path there is the program's own."""
    from commscope.commands.snapshot import summary
    from commscope.snapshot.infer import InFlight
    from commscope.snapshot.procs import Job, RankProcess
    from commscope.snapshot.take import Cycle

    proc = RankProcess(pid=4242, rank=0, world_size=1, local_rank=0, launcher="env", job="k", argv=("train.py",),
                       user=None, create_time=0.0)
    op = InFlight("all_reduce", "0", None, None, None, f"/srv/{CLEAR}x.py:3 in step", 1, False)
    summary(Job("k", "env", 1, [proc], [0]), Cycle(1, 0, 1, {0: op}, [], {}, []), "/tmp/s", "job-1", 0.0)
    out = capsys.readouterr().out
    assert "in all_reduce (group 0) at \\x1b[2Jx.py:3 in step" in out and "\x1b" not in out


def test_a_flight_recorder_dump_s_file_name_is_said_without_its_control_sequences(tmp_path, capsys):
    """A dump that cannot be read is named in a warning: a file's name is the store's too."""
    from commscope.cli import main as cli

    entry = {"record_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 1,
             "profiling_name": "nccl:all_reduce", "time_created_ns": 10**18, "state": "completed",
             "time_discovered_started_ns": 10**18 + 10, "time_discovered_completed_ns": 10**18 + 20}
    (tmp_path / "rank_1").write_text(json.dumps({"version": "2.10", "pg_config": {}, "entries": [entry]}))
    (tmp_path / f"evil{TITLE}_0").write_bytes(b"garbage")
    capsys.readouterr()
    cli(["check", str(tmp_path)])
    out = capsys.readouterr().out
    assert "skipped evil\\x1b]0;owned\\x07_0" in out and not CONTROL.search(out)


def test_a_crash_file_s_text_is_made_visible_where_it_is_read(tmp_path):
    """faulthandler's crash file (a segfault's stack, read beside the rank's stream, not
    through the schema): its paths and function names are the program's text."""
    from commscope.store.crashlog import crash_file_name
    from commscope.store.directory import DirectoryReader

    job = tmp_path / "job"
    job.mkdir()
    (job / "rank-00000.jsonl").write_bytes(b'{"type":"heartbeat","ts":1,"v":1,"rank":0}\n')
    (job / crash_file_name(0)).write_bytes(
        f'Fatal Python error: Segmentation fault{TITLE}{RLO}\n\nCurrent thread 0x00007f (most recent call first):\n'
        f'  File "/x/train{RLO}yp.py", line 3 in st{CLEAR}ep\n'.encode())
    events = DirectoryReader(job).read_all()
    assert [e["type"] for e in events] == ["heartbeat", "stack", "exit"]
    held = [s for e in events for s in strings(e) if CONTROL.search(s)]
    assert not held, held
    assert events[1]["threads"][0]["frames"] == [["/x/train\\u202eyp.py", 3, "st\\x1b[2Jep"]]
    assert events[2]["exc"] == "Fatal Python error: Segmentation fault\\x1b]0;owned\\x07\\u202e"
