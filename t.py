import sys
from commscope.snapshot import procs
B, P = int(sys.argv[1]), int(sys.argv[2])
f = procs.find([B, P])
for j in f.jobs: print(j.describe(), "gone", j.gone, [(r.pid, r.argv[:2]) for r in j.ranks])
f = procs.find([P])
for j in f.jobs: print("pid-only:", j.describe(), "gone", j.gone)
try:
    procs._int({"RANK":"²"}, "RANK")
except Exception as e: print("crash", repr(e))
from commscope.snapshot import pyspy
try: pyspy.parse([{"frames":[{"name":"f","filename":"x","line":"?"}]}])
except Exception as e: print("parse crash", repr(e))
