"""``commscope bench scale`` end to end: simulated ranks write a live job through the real
store writers, the console's data side follows it and finds the injected fault naming the
culprit.  Figures are the benchmark's business; this checks the finding, and that the job's
events were written and read."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from redis_fixture import require_redis_server


@pytest.mark.parametrize("store, fault, device", [("directory", "dead", False), ("redis-cluster", "mismatch", False),
                                                  ("directory", "two-hosts", True), ("directory", "host-lost", False),
                                                  ("directory", "missing", False)])
def test_bench_scale_finds_the_fault_it_injects(store, fault, device):
    """(``device``: a GPU job's records, a done with a device time after each end.)"""
    if store != "directory":
        require_redis_server()
    done = subprocess.run([sys.executable, "-m", "commscope", "bench", "scale", "--quick", "--store", store,
                           "--fault", fault, *(["--device-times"] if device else [])],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert re.search(r"fault -> finding: \d+\.\d s", out), out  # found, naming the culprit
    assert "other findings" not in out, out  # and nothing else: no victim blamed
    if fault == "host-lost":  # the host's eight ranks in one finding (the whole host is the culprit set)
        assert re.search(r"fault 'host-lost' at \d+ s on rank 35's host \(ranks 32-39\)", out), out
    # a hang: every rank in it captured its stack at hang_after, and the finding shows the ones
    # waiting as one stack, the culprit's apart (a mismatch names no rank waiting; a silent or
    # spinning culprit captured nothing)
    shown = re.search(r"its stacks, as last judged: (\d+) of (\d+) culprit\(s\) captured; ([\d,]+) waiting "
                      r"rank\(s\)\s+shown as (\d+) distinct stack", out)
    expect = {"dead": (0, 1, 63, 1), "host-lost": (0, 8, 56, 1), "missing": (0, 1, 63, 1), "mismatch": (1, 1, 0, 0)}
    if fault in expect:
        assert shown and tuple(int(x) for x in shown.groups()) == expect[fault], out
    else:
        assert shown is None, out
    # when the watermark first came within the target, and how far behind it stayed after
    assert re.search(r"caught up \(every stream read past the job's start, within 2 s\)\s+\d+\.\d s after the "
                     r"job's start; from then on median \d+\.\d\d s, p99 \d+\.\d\d s", out), out
    written = int(re.search(r"written: ([\d,]+) events", out).group(1).replace(",", ""))
    rate = int(re.search(r"the job's: ([\d,]+)\)", out).group(1).replace(",", ""))
    assert rate == 64 * (25 * (3 if device else 2) + 2)  # (a begin, an end, a done; a heartbeat, a sample)
    read = int(re.search(r"console: read ([\d,]+) events of 64 ranks", out).group(1).replace(",", ""))
    assert written > 0 and read >= written  # every event written was read (and the writers' meta lines)
    nodes = re.findall(r"127\.0\.0\.1:\d+ +([\d,]+): appends ([\d,]+), reads ([\d,]+)", out)
    if store == "redis-cluster":  # each master's requests, Redis's own count: the job's streams over all three
        assert len(nodes) == 3, out
        assert all(int(a.replace(",", "")) > 0 and int(r.replace(",", "")) > 0 for _, a, r in nodes), out
    else:
        assert not nodes and "store requests" not in out, out


def test_a_nodes_requests_leave_out_what_the_append_script_runs_inside():
    """Redis counts the commands a script runs as its own (an append's XREVRANGE and its
    XADDs): the requests per node are what clients sent, less the ``INFO`` that asked."""
    from commscope.bench.redis_server import command_calls
    from commscope.bench.scale import node_load

    before = command_calls("# Commandstats\r\ncmdstat_info:calls=4,usec=9,usec_per_call=2.25\r\n"
                           "cmdstat_eval:calls=10,usec=90\r\ncmdstat_xadd:calls=40,usec=9\r\n")
    assert before == {"info": 4, "eval": 10, "xadd": 40}
    after = {"info": 5, "eval": 30, "xadd": 120, "xrevrange": 23, "xread": 50, "xlen": 4, "config|get": 1}
    load = node_load("n1", before, after, 2.0)
    # 20 appends (each an XREVRANGE and XADDs inside), 50 XREADs, 3 XREVRANGEs of a reader,
    # 4 XLENs and a CONFIG GET; the INFO that asked is not the job's
    assert (load.appends, load.reads, load.other, load.requests) == (10.0, 25.0, 4.0, 39.0)


def test_the_extrapolation_apportions_a_polls_cost_to_records_and_to_streams_read():
    """``costs_of`` recovers the costs a run's polls were made of (an op record, a stream
    read with its heartbeat and sample) from steps that mix them in different proportions,
    as before and after a fault, and declines a fit it cannot make."""
    from commscope.bench.scale import costs_of

    per_record, per_read = 1.5e-6, 30e-6
    steps = [(records, reads, records * per_record + reads * per_read)
             for records, reads in [(4000, 1000), (8000, 2000), (0, 16000), (0, 9000), (120, 30), (64000, 16000),
                                    (30000, 9000), (0, 500)]]
    got = costs_of(steps)
    assert got is not None and got[0] == pytest.approx(per_record) and got[1] == pytest.approx(per_read)
    assert costs_of(steps[:4]) is None  # (too few steps)
    assert costs_of([(r, c, 1.0 - r * 1e-4) for r, c, _ in steps]) is None  # (a negative cost)
