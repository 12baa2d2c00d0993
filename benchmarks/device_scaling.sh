#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Scaling past two cores: the concurrent-enqueue benchmark at 1-16 producers,
# the peers at 8 producers and 8 workers, and the write-combining (lanes)
# benchmark at 1-16 writers, on a machine with more cores; with PARTS=seeds
# (or "scaling seeds"), also the NStore and durable-streams seed benchmarks,
# to see them where the background work has cores of its own; with
# PARTS=cpu, bench_cpu in the 2-worker configuration. Runs
# already-built benchmark executables (BIN) and writes their JSON and a log
# to OUT:
#   benchmarks/device_scaling.sh build-bench/benchmarks /tmp/scaling
#   PARTS=seeds benchmarks/device_scaling.sh build-bench/benchmarks /tmp/seeds
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
if [[ " $parts " == *" seeds "* ]]; then
  step 150 "$bin/bench_commit" --runs 5 --dir "${TMPDIR:-/tmp}" --json "$out/commit.json"
  step 150 "$bin/bench_debounce" --streams 150 --runs 3 --dir "${TMPDIR:-/tmp}" --json "$out/debounce.json"
fi
