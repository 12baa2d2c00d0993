#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds the libFuzzer harnesses with clang (ASan + UBSan + libFuzzer) into
# build-fuzz/ and runs each for a bounded time from its committed seed
# corpus. Independent of the CMake build: the normal gcc build never sees
# the harnesses.
#
#   scripts/fuzz.sh                 build, then run every harness ~30 s
#   FUZZ_SECONDS=300 scripts/fuzz.sh
#   scripts/fuzz.sh api             only fuzz_api (or: cli)
#   FUZZ_BUILD_ONLY=1 scripts/fuzz.sh
#   FUZZ_JOBS=2 scripts/fuzz.sh     parallel fuzzing processes per harness
#   FUZZ_SEED=7 scripts/fuzz.sh     another fixed seed (default 1; 0 = random)
#
# Replaying a fuzz_api input (see fuzz/fuzz_api.c): FUZZ_API_SEQUENTIAL=1 runs
# its two op streams one after the other (a race or a plain bug?),
# FUZZ_API_REACH=1 prints how often each op ran (`-runs=0 fuzz/corpus_api`:
# what the seeds reach), FUZZ_API_BOUND_MS (default 15000) is the watchdog's
# bound on one op.
#
# Needs clang and its runtime (Debian: clang, libclang-rt-14-dev; see
# scripts/deps.sh). New inputs found while fuzzing go to build-fuzz/corpus_*,
# never into the committed seeds; a crash leaves build-fuzz/crash-* and makes
# the script fail (reproduce with build-fuzz/fuzz_<name> <crash file>).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-30}
jobs=${FUZZ_JOBS:-1}
out=build-fuzz
cc=${FUZZ_CC:-}
if [ -z "$cc" ]; then
  for c in clang clang-14; do
    if command -v "$c" >/dev/null 2>&1; then cc=$c; break; fi
  done
fi
if [ -z "$cc" ]; then
  echo "fuzz.sh: clang not found (Debian: apt-get install clang libclang-rt-14-dev)" >&2
  exit 1
fi

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(api cli)

mkdir -p "$out"
# The same library sources as CMakeLists.txt's TKO_SOURCES, instrumented
# for coverage and the sanitizers along with the harness, with the
# lock-order checker on (src/platform/witness.h), as in every sanitizer build.
# Every library source but the sharing audit's (an option of its own): a
# list written out here went stale when keyed.c and resize.c came.
mapfile -t lib_sources < <(ls src/*/*.c | grep -v '^src/platform/audit\.c$')
flags=(-std=gnu11 -g -O1 -fno-omit-frame-pointer -pthread
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -DTKO_LOCK_ORDER_CHECK=1 -Iinclude ${FUZZ_EXTRA_CFLAGS:-})
for layer in src/*/; do flags+=(-I"$layer"); done

build() {
  local name=$1
  shift
  echo "== fuzz.sh: building $out/fuzz_$name with $cc"
  "$cc" "${flags[@]}" -o "$out/fuzz_$name" "$@" -lm
}

# Each harness is one compiler process: they build side by side.
pids=()
for t in "${targets[@]}"; do
  case $t in
    api) build api fuzz/fuzz_api.c "${lib_sources[@]}" & ;;
    cli) build cli -Iworkbench fuzz/fuzz_cli.c workbench/cli.c workbench/scenarios.c workbench/quote.c \
               "${lib_sources[@]}" & ;;
    *) echo "fuzz.sh: unknown harness '$t' (api, cli)" >&2; exit 2 ;;
  esac
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
[ "${FUZZ_BUILD_ONLY:-0}" = 1 ] && exit 0

status=0
for t in "${targets[@]}"; do
  seeds=fuzz/corpus_$t
  work=$out/corpus_$t
  mkdir -p "$work"
  echo "== fuzz.sh: fuzz_$t for ${seconds}s (seeds: $seeds, new inputs: $work)"
  # detect_leaks: LeakSanitizer after every input that leaks. fuzz_api's own
  # watchdog aborts an op that runs past 15 s, naming it; libFuzzer's timeout
  # is the backstop for a hang anywhere else; the rss limit catches runaway
  # memory. With FUZZ_JOBS > 1 libFuzzer runs that many
  # processes, each logging to fuzz-<n>.log in build-fuzz/.
  # A fixed seed (FUZZ_SEED, default 1) so that CI replays the same
  # mutations: a gate that fails at random is no gate. FUZZ_SEED=0 lets
  # libFuzzer pick one for exploring by hand.
  par=(-seed="${FUZZ_SEED:-1}")
  [ "$jobs" -gt 1 ] && par+=(-jobs="$jobs" -workers="$jobs")
  if ! (cd "$out" &&
        ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:${ASAN_OPTIONS:-}" \
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}" \
        "./fuzz_$t" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=3072 \
          -max_len=1024 -print_final_stats=1 "${par[@]}" \
          "corpus_$t" "../$seeds") > "$out/fuzz_$t.log" 2>&1; then
    status=1
    echo "fuzz.sh: fuzz_$t FAILED; the end of $out/fuzz_$t.log:" >&2
    tail -n 60 "$out/fuzz_$t.log" >&2
  else
    grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+.*DONE' \
      "$out"/fuzz_$t.log "$out"/fuzz-*.log 2>/dev/null || true
  fi
done
exit $status
