import sys
from commscope.snapshot import procs
from commscope.snapshot.take import Snapshotter
from commscope.commands.check import check_store
P = int(sys.argv[1])
f = procs.find([P])
j = f.jobs[0]
s = Snapshotter(j, sys.argv[2], "t", count=2, interval=0.2, native=False, use_flight=False)
c = s.cycle(); s.close()
print(c)
check_store(sys.argv[2])
