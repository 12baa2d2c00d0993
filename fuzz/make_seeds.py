#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the committed seed corpora, fuzz/corpus_api and fuzz/corpus_cli.

fuzz_api reads its input as a list of operations: one byte picks the
operation (the order of `enum op` in fuzz_api.c), one byte the pool slot,
then each operation reads its own arguments (see the op_* functions there).
The seeds below walk through every feature once so that fuzzing starts from
inputs that already reach deep into the library. Run it from anywhere:
    python3 fuzz/make_seeds.py
"""
import os
os.chdir(os.path.dirname(os.path.abspath(__file__)))
OPS = "CREATE SUBMIT SUBMIT_TIMED BATCH GROUP_SUBMIT GROUP_WAIT GROUP_CANCEL TIMER_AFTER TIMER_EVERY TIMER_CANCEL ASYNC COMPLETE PAUSE RESUME WAIT WAIT_FOREVER SHUTDOWN DESTROY STATS LANES COALESCE MISC".split()
O = {n: i for i, n in enumerate(OPS)}
def create(si, elastic=False, w=2, me=2, idle=5, cap=0, bound=0, policy=0, spin=2, aging=0, async_max=0, name=b"", hooks=0, mask=None, bad=0):
    b = [O["CREATE"], si, 1 if elastic else 0]
    b += [w, me, idle] if elastic else [w - 1]
    b += [cap, bound, policy, spin]
    extra = (1 if aging else 0) | (async_max << 1)
    b += [extra] + ([aging] if aging else [])
    b += [len(name)] + list(name)
    if mask is not None: hooks |= 64
    b += [hooks] + (list(mask) if mask is not None else [])
    b += [bad]
    return bytes(b)
def op(name, si, *args): return bytes([O[name], si] + list(args))
def submit(si, kind=0, status=0, w=3): return op("SUBMIT", si, kind, status, w)
seeds = {}
seeds["basic_submit_wait"] = create(0) + b"".join(submit(0, k, 1, 3 + k) for k in range(6)) + op("WAIT_FOREVER", 0) + op("STATS", 0) + op("DESTROY", 0)
seeds["elastic_only"] = create(1, True, 0, 3, 2) + b"".join(submit(1, 0, 0, i) for i in range(20)) + op("WAIT", 1, 2) + op("WAIT_FOREVER", 1) + op("DESTROY", 1)
seeds["bounded_reject"] = create(0, bound=3, policy=1) + op("PAUSE", 0) + b"".join(submit(0) for _ in range(5)) + op("RESUME", 0) + op("WAIT_FOREVER", 0)
seeds["bounded_block_timed"] = create(0, bound=4, policy=0) + op("PAUSE", 0) + b"".join(op("SUBMIT_TIMED", 0, 0, 0, 3, 2) for _ in range(6)) + op("SHUTDOWN", 0, 0)
seeds["caller_runs"] = create(2, bound=3, policy=2) + op("PAUSE", 2) + b"".join(submit(2, k % 6) for k in range(8)) + op("SHUTDOWN", 2, 1)
seeds["batch"] = create(0, cap=1) + op("BATCH", 0, 30) + op("BATCH", 0, 0) + op("BATCH", 0, 8, 0, 3) + op("WAIT_FOREVER", 0)
seeds["big_batch"] = create(0, cap=2) + op("BATCH", 0, 0xff, 50) + op("WAIT_FOREVER", 0)
seeds["groups"] = create(0) + create(1, True, 1, 1, 3) + b"".join(op("GROUP_SUBMIT", 0, 0, 0, 1, 0, 5) for _ in range(4)) + op("GROUP_SUBMIT", 1, 0, 0, 0, 0, 1) + op("GROUP_WAIT", 0, 0, 2, 0) + op("GROUP_CANCEL", 0, 0) + op("GROUP_SUBMIT", 0, 1, 1, 1, 2, 3) + op("GROUP_WAIT", 0, 1, 2, 0)
seeds["timers"] = create(0, hooks=0) + op("TIMER_AFTER", 0, 0, 0, 0, 0, 3) + op("TIMER_AFTER", 0, 1, 3, 0, 1, 3) + op("TIMER_EVERY", 0, 2, 1, 0, 0, 3) + op("TIMER_EVERY", 0, 3, 0, 0, 0, 3) + op("TIMER_CANCEL", 0, 1) + op("TIMER_AFTER", 0, 4, 2, 0xee, 0, 3) + op("WAIT", 0, 2) + op("SHUTDOWN", 0, 0)
seeds["async_held"] = create(0, async_max=1) + b"".join(op("ASYNC", 0, 1, 0, 3) for _ in range(5)) + op("ASYNC", 0, 0, 1, 3) + op("WAIT", 0, 1) + op("MISC", 0, 4, 0, 1) + op("COMPLETE", 0) + op("WAIT_FOREVER", 0)
seeds["async_cancel"] = create(0, async_max=2) + b"".join(op("ASYNC", 0, 1, 0, 3) for _ in range(6)) + op("SHUTDOWN", 0, 1)
seeds["pause_resume"] = create(0, elastic=True, w=1, me=2, idle=1) + op("PAUSE", 0) + b"".join(submit(0, 2, 1) for _ in range(6)) + op("WAIT", 0, 1) + op("RESUME", 0) + op("WAIT_FOREVER", 0) + op("PAUSE", 0) + op("DESTROY", 0)
seeds["hooks"] = create(0, elastic=True, w=1, me=1, idle=1, hooks=1 | 2 | 4 | 8 | 16 | 32) + b"".join(submit(0, k % 6, 2) for k in range(12)) + op("WAIT_FOREVER", 0)
seeds["self_misuse"] = create(0, w=2) + submit(0, 3) + submit(0, 3) + submit(0, 4) + op("WAIT_FOREVER", 0)
seeds["failing_alloc"] = create(0, cap=2, mask=bytes([0x55, 0xaa, 0x0f, 0xf0, 0x33, 0xcc, 0x01, 0x80])) + b"".join(submit(0, 0, 0, i * 37 % 256) for i in range(40)) + op("BATCH", 0, 35) + op("ASYNC", 0, 1, 0, 3) + op("WAIT_FOREVER", 0)
seeds["failing_create"] = create(1, mask=bytes([0xff] * 8)) + create(1, mask=bytes([0x01] + [0] * 7)) + submit(1) + op("DESTROY", 1)
seeds["invalid_options"] = create(0, bad=0xf1) + create(0, bad=0xf3) + create(0, bad=0xf5) + create(0, elastic=True, w=0, me=0) + op("MISC", 0, 1) + op("MISC", 0, 2) + op("MISC", 0, 0, 1, 2, 3, 4) + op("MISC", 0, 3) + op("MISC", 0, 5, 1, 1, 0)
seeds["lanes"] = create(0, w=2) + op("LANES", 0, 0, 2, 2, 1, 1) + b"".join(op("LANES", 0, 1, 0, k, 3) for k in range(10)) + op("LANES", 0, 3, 2) + op("LANES", 0, 4, 0) + op("LANES", 0, 1, 0, 1, 3) + op("LANES", 0, 5)
seeds["lanes_cancel"] = create(0, w=1) + op("LANES", 0, 0, 1, 1, 1, 0) + b"".join(op("LANES", 0, 2, 1, k, 3) for k in range(8)) + op("SHUTDOWN", 0, 1) + op("LANES", 0, 5)
seeds["coalescer"] = create(0) + op("COALESCE", 0, 0, 2, 3, 1) + b"".join(op("COALESCE", 0, 1, k, 0, 0, 0, k) for k in range(10)) + op("COALESCE", 0, 3) + op("COALESCE", 0, 4)
seeds["three_pools"] = create(0) + create(1, True, 0, 2, 1) + create(2, bound=8, policy=1) + b"".join(submit(i % 3, i % 6, 1, i) for i in range(30)) + op("SHUTDOWN", 0, 1) + op("DESTROY", 1) + op("WAIT_FOREVER", 2)
seeds["named_aging"] = create(0, aging=3, name=b"fuzzpoolname") + b"".join(submit(0, 0, 0, i) for i in range(10)) + op("WAIT_FOREVER", 0)
for name, data in seeds.items():
    with open(os.path.join("corpus_api", name), "wb") as f: f.write(data)
cli = {
 "help": b"--help",
 "cpu": b"--scenario\0cpu",
 "cpu_eq": b"--scenario=cpu\0--workers=2\0--tasks=100",
 "elastic": b"--scenario\0io\0--pool\0elastic\0--workers\0" b"0\0--max-elastic\0" b"4\0--idle-ms\0" b"50",
 "weights": b"--scenario\0mixed\0--weights\0-5:5\0--fail-pct\0" b"2.5\0--io-pct\0" b"10",
 "bursts": b"--scenario\0burst\0--bursts\0" b"3\0--gap-ms\0" b"10\0--tail-ms\0" b"0\0--seed\0" b"0x1234",
 "outputs": b"--scenario\0stress\0--json\0out.json\0--timeline\0t.csv\0--plot\0p.svg\0--quiet",
 "bad_number": b"--scenario\0cpu\0--workers\0-1",
 "bad_range": b"--scenario\0cpu\0--weights\0" b"5:1",
 "unknown": b"--scenario\0nope\0--frobnicate",
 "missing_value": b"--scenario\0cpu\0--tasks",
 "basic_elastic_mix": b"--scenario\0concurrent\0--pool\0basic\0--max-elastic\0" b"2",
 "producers": b"--scenario\0concurrent\0--producers\0" b"8\0--task-us\0" b"5",
 "demo": b"--scenario\0demo",
}
for name, data in cli.items():
    with open(os.path.join("corpus_cli", name), "wb") as f: f.write(data)
print(len(seeds), len(cli))
