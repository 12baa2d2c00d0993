#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs test suites beside two CPU-bound hog processes, several times: every
# test must hold on a machine whose cores are taken (docs/TESTING.md, "Tests
# under load"). A test that needs a timing precondition reruns its scene
# when the hogs break it; one that reads a figure too early fails here.
#
# Usage: scripts/test_under_load.sh [-n RUNS] [-R REGEX] [--no-build] [BUILD_DIR...]
#   BUILD_DIR  default: build-test-plain build-test-address. A missing
#              build-test-<flavour> (plain, onequeue, thread, address) is
#              configured as scripts/test.sh configures it.
#   -n RUNS    runs of every build's tests (default 5)
#   -R REGEX   only the tests ctest -R selects
#   --no-build run what is built (default: build each directory first)
# JOBS (default nproc) sets the build's parallelism. Prints a pass count
# and exits non-zero if any run failed; the log of a failed run is printed
# and kept in the build directory (load-run-N.log).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=5
filter=
build=1
dirs=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) runs=$2; shift 2 ;;
    -R) filter=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    -h | --help) sed -n '3,17p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) dirs+=("$1"); shift ;;
  esac
done
[ ${#dirs[@]} -gt 0 ] || dirs=(build-test-plain build-test-address)
jobs=${JOBS:-$(nproc)}

# Configures a missing build-test-<flavour> with scripts/test.sh's flags.
configure() {
  local dir=$1 san queues witness=ON
  case "$(basename "$dir")" in
    build-test-plain) san= queues=0 ;;
    build-test-onequeue) san= queues=1 ;;
    build-test-thread) san=thread queues=0 ;;
    build-test-address) san=address queues=0 ;;
    *) echo "$dir is missing and not a build-test-<flavour> this script knows" >&2; exit 2 ;;
  esac
  [ -n "$san" ] || witness=OFF
  echo "== configure $dir"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTKO_SANITIZE="$san" -DTKO_WERROR=ON \
    -DTKO_LOCK_ORDER_CHECK=$witness -DTKO_DEFAULT_QUEUES="$queues" >/dev/null
}

for dir in "${dirs[@]}"; do
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    configure "$dir"
    build=1
  fi
done
if [ "$build" = 1 ]; then
  for dir in "${dirs[@]}"; do
    echo "== build $dir"
    cmake --build "$dir" -j "$jobs" >/dev/null
  done
fi

hogs=()
stop_hogs() {
  for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${hogs[@]}"; do wait "$pid" 2>/dev/null || true; done
  hogs=()
}
trap stop_hogs EXIT
trap 'stop_hogs; exit 130' INT TERM
for _ in 1 2; do
  sh -c 'while :; do :; done' &
  hogs+=($!)
done
echo "== two CPU hogs running (pids ${hogs[*]})"

passed=0
for ((run = 1; run <= runs; run++)); do
  ok=1
  for dir in "${dirs[@]}"; do
    log=$dir/load-run-$run.log
    args=(--test-dir "$dir" --output-on-failure --no-tests=error -j 1)
    [ -z "$filter" ] || args+=(-R "$filter")
    if TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
      ASAN_OPTIONS="detect_leaks=1 halt_on_error=1" \
      UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1" \
      ctest "${args[@]}" >"$log" 2>&1; then
      echo "run $run/$runs $dir: $(grep -E 'tests passed' "$log" | tail -1)"
    else
      ok=0
      echo "run $run/$runs $dir: FAILED (log: $log)"
      cat "$log"
    fi
  done
  [ "$ok" = 0 ] || passed=$((passed + 1))
done
stop_hogs
echo "== $passed of $runs runs passed under load (${dirs[*]}${filter:+, -R $filter})"
[ "$passed" = "$runs" ]
