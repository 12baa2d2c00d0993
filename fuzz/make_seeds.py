#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the committed seed corpora, fuzz/corpus_api and fuzz/corpus_cli.

fuzz_api reads its input as: one header byte (the completion queue's size),
then two op streams separated by SEP, run by two threads at once. In a
stream one byte picks the operation (the order of `enum op` in fuzz_api.c),
one byte the pool slot, then each operation reads its own arguments (see the
op_* functions there). The seeds below reach every op, and every public
call, so that fuzzing starts from inputs that already go deep into the
library; check_reach() below fails if one is missing. Run it from anywhere:
    python3 fuzz/make_seeds.py
"""
import os
os.chdir(os.path.dirname(os.path.abspath(__file__)))
OPS = ("CREATE SUBMIT SUBMIT_TIMED BATCH GROUP_SUBMIT GROUP_WAIT GROUP_CANCEL TIMER_AFTER "
       "TIMER_EVERY TIMER_CANCEL ASYNC COMPLETE PAUSE RESUME WAIT WAIT_FOREVER SHUTDOWN DESTROY "
       "STATS LANES COALESCE MISC KEYED CQ HANDLE").split()
O = {n: i for i, n in enumerate(OPS)}
SEP = bytes([0xb5, 0x5b, 0x5b, 0xb5])
used = set()

def create(si, elastic=False, w=2, me=2, idle=5, cap=0, bound=0, policy=0, spin=2, aging=0,
           async_max=0, batch=0, name=b"", hooks=0, mask=None, place=False, bad=0):
    used.add("CREATE")
    b = [O["CREATE"], si, 1 if elastic else 0]
    b += [w, me, idle] if elastic else [w - 1]
    b += [cap, bound, policy, spin]
    extra = (1 if aging else 0) | (async_max << 1) | (batch << 3)
    b += [extra] + ([aging - 1] if aging else [])
    b += [len(name)] + list(name)
    if mask is not None: hooks |= 64
    if place: hooks |= 128
    b += [hooks] + (list(mask) if mask is not None else [])
    b += [bad]
    return bytes(b)

def op(name, si, *args):
    used.add(name)
    return bytes([O[name], si] + list(args))

# Weight bytes: weight(b) = (b % 16) - 8 when b % 8 >= 3; 0 -> INT_MAX, 1 -> INT_MIN.
# WS[i]: the byte of the i-th of the weights -5..-1, 3..7 (those one byte gives).
WS = [b for b in range(16) if b % 8 >= 3]
def submit(si, kind=0, status=0, w=3): return op("SUBMIT", si, kind, status, w)
def stream(*parts): return b"".join(parts)
def two(a, b=b"", hdr=0): return bytes([hdr]) + a + SEP + b

seeds = {}
seeds["basic_submit_wait"] = two(create(0) + stream(*(submit(0, k, 1, 3 + k) for k in range(7))) + op("WAIT_FOREVER", 0) + op("STATS", 0, 1) + op("DESTROY", 0, 0))
seeds["elastic_only"] = two(create(1, True, 0, 3, 2) + stream(*(submit(1, 0, 0, i) for i in range(20))) + op("WAIT", 1, 2) + op("WAIT_FOREVER", 1) + op("DESTROY", 1, 0))
seeds["bounded_reject"] = two(create(0, bound=3, policy=1) + op("PAUSE", 0) + stream(*(submit(0) for _ in range(5))) + op("RESUME", 0) + op("WAIT_FOREVER", 0))
# A submit that blocks on the full queue of a paused pool: the rescuer (or the other stream) resumes it.
seeds["bounded_block_paused"] = two(create(0, bound=4, policy=0) + op("PAUSE", 0) + stream(*(op("SUBMIT_TIMED", 0, 0, 0, 3, 2) for _ in range(5))) + submit(0) + submit(0) + op("SHUTDOWN", 0, 0),
                                    stream(*(op("WAIT", 1, 1) for _ in range(3))) + op("RESUME", 0))
seeds["caller_runs"] = two(create(2, bound=3, policy=2) + op("PAUSE", 2) + stream(*(submit(2, k % 7) for k in range(8))) + op("SHUTDOWN", 2, 1))
seeds["batch"] = two(create(0, cap=1) + op("BATCH", 0, 30, 1, 2) + op("BATCH", 0, 0, 1, 0) + op("BATCH", 0, 8, 0, 3, 1) + op("WAIT_FOREVER", 0))
seeds["big_batch"] = two(create(0, cap=2) + op("BATCH", 0, 0xff, 50, 1, 0) + op("WAIT_FOREVER", 0))
seeds["groups"] = two(create(0) + create(1, True, 1, 1, 3) + stream(*(op("GROUP_SUBMIT", 0, 0, 0, 1, 0, 5) for _ in range(4))) + op("GROUP_SUBMIT", 1, 0, 0, 0, 0, 1) + op("GROUP_WAIT", 0, 0, 3, 0) + op("GROUP_CANCEL", 0, 0) + op("GROUP_SUBMIT", 0, 1, 1, 1, 2, 3) + op("GROUP_WAIT", 0, 1, 0, 0),
                      op("GROUP_SUBMIT", 0, 2, 0, 0, 1, 11) + op("GROUP_WAIT", 0, 2, 2, 1) + op("GROUP_CANCEL", 0, 2))
seeds["timers"] = two(create(0) + op("TIMER_AFTER", 0, 0, 0, 0, 0, 3) + op("TIMER_AFTER", 0, 1, 3, 0, 1, 3) + op("TIMER_EVERY", 0, 2, 1, 0, 0, 3) + op("TIMER_EVERY", 0, 3, 0, 0, 0, 3) + op("TIMER_CANCEL", 0, 1) + op("TIMER_AFTER", 0, 4, 2, 0xee, 0, 3) + op("TIMER_AFTER", 0, 5, 2, 0xef, 0, 3) + op("WAIT", 0, 2) + op("TIMER_CANCEL", 0, 2) + op("SHUTDOWN", 0, 0),
                      op("TIMER_EVERY", 0, 6, 1, 0, 0, 3) + op("WAIT", 0, 2) + op("TIMER_AFTER", 0, 6, 1, 0, 1, 0, 3) + op("TIMER_CANCEL", 0, 6))
seeds["async_held"] = two(create(0, async_max=1) + stream(*(op("ASYNC", 0, 1, 0, 3) for _ in range(5))) + op("ASYNC", 0, 0, 1, 3) + op("WAIT", 0, 1) + op("MISC", 0, 4, 0, 1) + op("COMPLETE", 0) + op("WAIT_FOREVER", 0))
# Shutdown with async tasks held in flight: a deadline, then CANCEL_NOWAIT; the rescuer completes them.
seeds["async_shutdown_deadline"] = two(create(0, async_max=2) + stream(*(op("ASYNC", 0, 1, 0, 3) for _ in range(6))) + op("SHUTDOWN", 0, 6, 2, 1) + op("DESTROY", 0, 4))
seeds["async_shutdown_untimed"] = two(create(0) + stream(*(op("ASYNC", 0, 1, 0, 3) for _ in range(3))) + op("SHUTDOWN", 0, 1),
                                      op("ASYNC", 0, 1, 0, 3) + op("WAIT_FOREVER", 0))
seeds["shutdown_modes"] = two(create(0) + create(1) + create(2, w=1) + stream(*(submit(i % 3, 5, 4) for i in range(9))) + op("SHUTDOWN", 0, 2) + op("SHUTDOWN", 1, 4) + op("SHUTDOWN", 2, 7, 1, 2) + op("SHUTDOWN", 2, 8) + op("DESTROY", 1, 1 | 1 << 4),
                              stream(*(submit(i % 3, 0, 0) for i in range(6))) + op("DESTROY", 2, 2))
seeds["pause_resume"] = two(create(0, elastic=True, w=1, me=2, idle=1) + op("PAUSE", 0) + stream(*(submit(0, 2, 1) for _ in range(6))) + op("WAIT", 0, 1) + op("RESUME", 0) + op("WAIT_FOREVER", 0) + op("PAUSE", 0) + op("DESTROY", 0, 0))
# One worker, tasks queued while paused: they must start by weight, then FIFO.
seeds["ordered_window"] = two(create(0, w=1) + op("PAUSE", 0) + stream(*(submit(0, 0, 0, WS[(i * 7) % 10]) for i in range(12))) + op("BATCH", 0, 9, 1, 3) + op("GROUP_SUBMIT", 0, 0, 0, 0, 0, WS[4]) + op("RESUME", 0) + op("WAIT_FOREVER", 0) + stream(*(submit(0, 5, 3, WS[i % 3]) for i in range(10))) + op("WAIT_FOREVER", 0),
                              create(1, w=1, aging=2) + stream(*(submit(1, 0, 0, WS[i % 4 * 2]) for i in range(10))) + op("WAIT_FOREVER", 1))
seeds["hooks"] = two(create(0, elastic=True, w=1, me=1, idle=1, hooks=1 | 2 | 4 | 8 | 16 | 32) + stream(*(submit(0, k % 7, 2) for k in range(12))) + op("WAIT_FOREVER", 0))
seeds["self_misuse"] = two(create(0, w=2) + submit(0, 3) + submit(0, 3) + submit(0, 4) + op("WAIT_FOREVER", 0))
seeds["failing_alloc"] = two(create(0, cap=2, mask=bytes([0x55, 0xaa, 0x0f, 0xf0, 0x33, 0xcc, 0x01, 0x80])) + stream(*(submit(0, 0, 0, i * 37 % 256) for i in range(40))) + op("BATCH", 0, 35, 1, 0) + op("ASYNC", 0, 1, 0, 3) + op("KEYED", 0, 0, 0, 1, 3) + op("WAIT_FOREVER", 0))
seeds["failing_create"] = two(create(1, mask=bytes([0xff] * 8)) + create(1, mask=bytes([0x01] + [0] * 7)) + submit(1) + op("DESTROY", 1, 0))
seeds["invalid_options"] = two(create(0, bad=0xf1) + create(0, bad=0xf3) + create(0, bad=0xf5) + create(0, bad=0xf6) + create(0, bad=0xf7) + create(0, elastic=True, w=0, me=0) + op("MISC", 0, 1) + op("MISC", 0, 2) + op("MISC", 0, 0, 1, 2, 3, 4) + op("MISC", 0, 3) + op("MISC", 0, 5, 1, 1, 0) + op("MISC", 0, 6, 2) + op("MISC", 0, 6, 3))
seeds["placement"] = two(create(0, w=2, place=True, batch=1) + stream(*(submit(0, 4, 1) for _ in range(4))) + op("WAIT_FOREVER", 0))
seeds["lanes"] = two(create(0, w=2) + op("LANES", 0, 0, 2, 2, 1) + stream(*(op("LANES", 0, 1, 0, k, 3) for k in range(10))) + op("LANES", 0, 3, 3) + op("LANES", 0, 5) + op("LANES", 0, 1, 0, 1, 3) + op("STATS", 0, 0) + op("LANES", 0, 6),
                     create(1, w=3) + op("LANES", 1, 0, 0x20 | 3, 1, 1) + stream(*(op("LANES", 1, 2, 1, k % 3, 3) for k in range(10))) + op("LANES", 1, 3, 0) + op("LANES", 1, 6))
seeds["lanes_cancel"] = two(create(0, w=1) + op("LANES", 0, 0, 0x80 | 1, 1, 1) + op("PAUSE", 0) + stream(*(op("LANES", 0, 2, 1, k, 3) for k in range(8))) + op("LANES", 0, 4) + op("SHUTDOWN", 0, 1) + op("LANES", 0, 6))
seeds["lanes_attached_destroy"] = two(create(0, w=1) + op("LANES", 0, 0, 2, 2, 1) + op("COALESCE", 0, 0, 2, 3, 1) + stream(*(op("LANES", 0, 1, 0, k, 3) for k in range(5))) + op("DESTROY", 0, 3))
seeds["coalescer"] = two(create(0) + op("COALESCE", 0, 0, 2, 3, 1) + stream(*(op("COALESCE", 0, 1, k) for k in range(10))) + op("COALESCE", 0, 3) + op("COALESCE", 0, 4) + op("COALESCE", 0, 1, 3) + op("COALESCE", 0, 5),
                         stream(*(op("COALESCE", 0, 2, k % 4) for k in range(10))) + op("COALESCE", 0, 3))
seeds["keyed"] = two(create(0, w=3) + stream(*(op("KEYED", 0, k % 6, 1, k % 5, 3) for k in range(15))) + op("WAIT_FOREVER", 0) + op("PAUSE", 0) + stream(*(op("KEYED", 0, 0, 0, k % 2, 3) for k in range(6))) + op("SHUTDOWN", 0, 1),
                     stream(*(op("KEYED", 0, 3, 2, k % 5, 4) for k in range(15))))
seeds["keyed_bounded"] = two(create(1, w=1, bound=2, policy=0) + stream(*(op("KEYED", 1, 0, 0, k % 3, 3) for k in range(8))) + op("PAUSE", 1) + stream(*(op("KEYED", 1, 0, 0, k % 3, 3) for k in range(4))) + op("DESTROY", 1, 0),
                             create(2, w=1, bound=1, policy=2) + stream(*(op("KEYED", 2, 0, 0, k % 2, 3) for k in range(6))))
seeds["completion"] = two(create(0) + stream(*(submit(0, 6, 1) for _ in range(10))) + stream(*(op("CQ", 0, 0) for _ in range(5))) + op("CQ", 0, 2, 2) + op("CQ", 0, 3, 3) + op("CQ", 0, 4) + op("KEYED", 0, 4, 0, 1, 3),
                          stream(*(op("CQ", 0, 1) for _ in range(5))) + op("CQ", 0, 2, 0) + op("CQ", 0, 3, 0), hdr=3)
seeds["three_pools_two_threads"] = two(create(0) + create(1, True, 0, 2, 1) + create(2, bound=8, policy=1) + stream(*(submit(i % 3, i % 7, 1, i) for i in range(30))) + op("SHUTDOWN", 0, 1) + op("DESTROY", 1, 0) + op("WAIT_FOREVER", 2),
                                       stream(*(submit(i % 3, i % 6, 2, i) for i in range(30))) + op("PAUSE", 2) + op("WAIT", 2, 1) + op("RESUME", 2) + op("DESTROY", 2, 2))
seeds["named_aging"] = two(create(0, aging=3, name=b"fuzzpoolname") + stream(*(submit(0, 0, 0, i) for i in range(10))) + op("WAIT_FOREVER", 0))
# UBSan once stopped CI here: tko_strerror of -INT_MIN (kept as a seed).
seeds["regress_strerror_int_min"] = two(op("MISC", 0, 0, 0x80, 0, 0, 0))

# Task handles: HANDLE, slot, handle (of 6), what (0 submit: kind, status, weight; 1 cancel;
# 2 wait: ms 0..2; 3 status). Queued while paused, some cancelled, waited on, re-armed; the
# other stream cancels and reads the same handles at once; a handle outlives its pool.
def handle(si, h, what, *args): return op("HANDLE", si, h, what, *args)
seeds["handles"] = two(create(0, w=1) + create(1, w=2) + op("PAUSE", 0) + stream(*(handle(0, h, 0, h % 7, 2, WS[h % 4]) for h in range(6))) +
                       handle(0, 1, 1) + handle(0, 3, 1) + handle(0, 3, 1) + handle(0, 0, 2, 1) + op("RESUME", 0) + stream(*(handle(0, h, 2, 2) for h in range(6))) +
                       stream(*(handle(0, h, 3) for h in range(6))) + handle(0, 2, 0, 1, 3, 3) + handle(0, 2, 1) + op("DESTROY", 0, 0) + handle(0, 2, 3) + handle(1, 2, 0, 0, 0, 3) + handle(1, 2, 2, 2),
                       stream(*(handle(0, h, 1) for h in (5, 4, 5))) + handle(0, 4, 3) + handle(1, 0, 3) + handle(0, 5, 2, 0))

def check_reach():
    missing = set(OPS) - used
    assert not missing, "no seed reaches " + " ".join(sorted(missing))

check_reach()
for f in os.listdir("corpus_api"): os.remove(os.path.join("corpus_api", f))
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
 "handles": b"--scenario\0mixed\0--handles\0" b"16\0--cancel-pct\0" b"20",
}
for name, data in cli.items():
    with open(os.path.join("corpus_cli", name), "wb") as f: f.write(data)
print(len(seeds), len(cli))
