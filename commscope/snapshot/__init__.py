"""``commscope snapshot``: what a job that was never instrumented is doing, from outside.

It finds the job's rank processes on this host (``procs``), takes each one's Python stacks
with py-spy a few times (``pyspy``), reads from the frames which collective a rank is inside
(``infer``, pure) and writes an ordinary trace store that ``check``, ``replay`` and the
console read (``take``).  Flight Recorder dumps the job wrote are collected beside the
stacks (``flight``).  Nothing here imports torch: the job's processes are only read.
"""
