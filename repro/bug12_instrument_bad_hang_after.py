import os, sys, torch, torch.distributed as dist, commscope
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3])
ha = float(sys.argv[1]) if sys.argv[1] != "none" else None
si = float(sys.argv[2])
try:
    commscope.instrument(sys.argv[4], hang_after=ha, sample_interval=si)
except Exception as e:
    print("instrument raised:", type(e).__name__, e); sys.exit(0)
dist.init_process_group("gloo", rank=0, world_size=1)
for _ in range(3):
    dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
commscope.uninstrument()
print("ok")
