#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Scaling past two cores: the concurrent-enqueue benchmark at 1-16 producers,
# the peers at 8 producers and 8 workers, and the write-combining (lanes)
# benchmark at 1-16 writers, on a machine with more cores; with PARTS=seeds
# (or "scaling seeds"), also the NStore and durable-streams seed benchmarks,
# to see them where the background work has cores of its own; with
# PARTS=cpu, bench_cpu in the 2-worker configuration. Issue 15's run on a
# 16-core machine is PARTS="matrix quality model" (about 9 minutes):
#   matrix:  bench_concurrent over producers 1,2,4,8 x workers 1,2,4,8, empty
#            and 1 us tasks, four interleaved weights and one weight, single
#            and batch-64 submits, medians of 5, with one queue and with a
#            queue per worker (one JSON per workers x weights x queues)
#   quality: bench_inversion, 8 producers, 8 workers, 10 us tasks, weights
#            0-6 and 1% weight 7: late inversions at delta 100 us, weight-7
#            p50/p99 wait; one queue and eight
#   model:   the bottleneck model's inputs (MODEL.md): probe_pingpong's line
#            hand-off between two cores and contended CAS at 2-16 cores, and
#            one producer and one worker pinned to two cores
# Runs already-built benchmark executables (BIN) and writes their JSON and a
# log to OUT:
#   benchmarks/device_scaling.sh build-bench/benchmarks /tmp/scaling
#   PARTS=seeds benchmarks/device_scaling.sh build-bench/benchmarks /tmp/seeds
#   PARTS="matrix quality model" benchmarks/device_scaling.sh build-bench/benchmarks /tmp/i15
# Each step has its own time limit so that one slow step cannot eat the rest.
set -uo pipefail
bin=${1:?usage: device_scaling.sh BIN_DIR OUT_DIR}
out=${2:?usage: device_scaling.sh BIN_DIR OUT_DIR}
mkdir -p "$out"
log="$out/scaling.log"
{
  echo "# date: $(date -u +%FT%TZ)"
  echo "# cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo "# kernel: $(uname -sr)"
} | tee "$log"
step() { # $1 = limit in seconds, then the command
  local limit=$1
  shift
  echo "## $*" | tee -a "$log"
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  echo "## exit ${PIPESTATUS[0]}" | tee -a "$log"
}
parts=${PARTS:-scaling}
# SMOKE=1: the matrix, quality and model parts with tiny sizes and one run,
# to check the script on any machine (figures meaningless).
if [ -n "${SMOKE:-}" ]; then
  matrix_size=(--smoke) quality_size=(--smoke) local_size=(--smoke) probe_size=(10000 1)
else
  matrix_size=(--runs 5 --empty-tasks 500000 --work-tasks 200000)
  quality_size=(--runs 5 --work-ns 10000 --tasks 200000)
  local_size=(--runs 5 --empty-tasks 500000 --work-tasks 100000)
  probe_size=(1000000 5)
fi
if [[ " $parts " == *" scaling "* ]]; then
step 150 "$bin/bench_concurrent" --producers 1,2,4,8,16 --workers 8 --runs 3 \
  --json "$out/concurrent_w8.json"
step 90 "$bin/bench_concurrent" --producers 1,2,4,8,16 --workers 2 --runs 3 --batch 1 \
  --json "$out/concurrent_w2.json"
step 90 "$bin/bench_peers" --workloads empty,concurrent --workers 8 --producers 8 --runs 3 \
  --json "$out/peers_w8.json"
step 150 "$bin/bench_combining" --writers 1,2,4,8,16 --workers 8 --runs 3 \
  --json "$out/combining_w8.json"
fi
if [[ " $parts " == *" cpu "* ]]; then
  # The 2-core configuration, on a machine whose idle cores wake fast.
  step 120 "$bin/bench_cpu" --workers 2 --elastic-basic 1 --elastic-max 2 --runs 7 \
    --json "$out/cpu_w2.json"
fi
if [[ " $parts " == *" matrix "* ]]; then
  # 500k empty tasks a case (the default million would take twice as long
  # for a median that moves little); 200k tasks of 1 us.
  # Each case twice: one queue (the default) and a queue per worker
  # (tko_options.queues; src/engine/shard.c).
  for workers in 1 2 4 8; do
    for weights in 4 1; do
      queue_counts=(1)
      [ "$workers" = 1 ] || queue_counts+=("$workers")
      for queues in "${queue_counts[@]}"; do
        step 150 "$bin/bench_concurrent" --producers 1,2,4,8 --workers "$workers" \
          --weights "$weights" --batch 1,64 --queues "$queues" "${matrix_size[@]}" \
          --json "$out/matrix_w${workers}_k${weights}_q${queues}.json"
      done
    done
  done
fi
if [[ " $parts " == *" quality "* ]]; then
  for queues in 1 8; do
    step 120 "$bin/bench_inversion" --producers 8 --workers 8 --high-every 100 --delta-us 100 \
      --queues "$queues" "${quality_size[@]}" --json "$out/inversion_p8_w8_q${queues}.json"
  done
fi
if [[ " $parts " == *" model "* ]]; then
  # Transfer time: one line handed between two cores (0 and the last, then
  # 0 and 1), and the service time of one line CASed by 2-16 cores.
  last=$(($(nproc) - 1))
  step 60 "$bin/probe_pingpong" pingpong 0 "$last" "${probe_size[@]}"
  step 60 "$bin/probe_pingpong" pingpong 0 1 "${probe_size[@]}"
  for n in 2 4 8 16; do
    if [ "$n" -le "$(nproc)" ]; then step 60 "$bin/probe_pingpong" cas "$n" "${probe_size[@]}"; fi
  done
  # Local costs: one producer and one worker, pinned to two cores.
  step 90 taskset -c 0,1 "$bin/bench_concurrent" --producers 1 --workers 1 --batch 1,64 \
    "${local_size[@]}" --json "$out/model_local_p1_w1.json"
fi
if [[ " $parts " == *" seeds "* ]]; then
  step 150 "$bin/bench_commit" --runs 5 --dir "${TMPDIR:-/tmp}" --json "$out/commit.json"
  step 150 "$bin/bench_debounce" --streams 150 --runs 3 --dir "${TMPDIR:-/tmp}" --json "$out/debounce.json"
fi
