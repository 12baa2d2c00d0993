#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds and runs the whole test suite four times: plain, plain on pools of
# one queue, under ThreadSanitizer, and under AddressSanitizer+UBSan;
# then the audit, install,
# embedding, ABI and documentation checks (scripts/ci_*.sh), the coverage
# gate (scripts/coverage.sh), the mutants (scripts/mutants.sh;
# TKO_SKIP_MUTANTS=1 skips them for a quick local run) and the fuzzers.
# Installs its own packages first (scripts/deps.sh). Any failure stops it
# with a non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)
# flavour:sanitizer:queues. "queues" is what tko_options.queues = 0 means
# in that build (TKO_DEFAULT_QUEUES; 0: a queue per basic worker, the
# default): every flavour runs the suite on the default, and one plain
# build on pools of one queue (src/engine/shard.c).
for spec in plain::0 onequeue::1 thread:thread:0 address:address:0; do
  IFS=: read -r flavour san queues <<<"$spec"
  dir=build-test-$flavour
  witness=OFF # the sanitizer flavours run every test with the lock-order checker (src/platform/witness.h)
  [ -z "$san" ] || witness=ON
  echo "== $flavour: configure and build ($dir; $queues queues by default)"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTKO_SANITIZE="$san" -DTKO_WERROR=ON \
    -DTKO_LOCK_ORDER_CHECK=$witness -DTKO_DEFAULT_QUEUES="$queues" >/dev/null
  cmake --build "$dir" -j "$jobs" >/dev/null
  echo "== $flavour: tests"
  # halt_on_error: a sanitizer report fails the run instead of scrolling by.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  ASAN_OPTIONS="detect_leaks=1 halt_on_error=1" \
  UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1" \
    ctest --test-dir "$dir" --output-on-failure -j 1
done
echo "== sharing audit: the instrumented build checks itself (benchmarks/MODEL.md)"
cmake -S . -B build-test-audit -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTKO_SHARING_AUDIT=ON -DTKO_WERROR=ON \
  -DTKO_BUILD_WORKBENCH=OFF >/dev/null
cmake --build build-test-audit -j "$jobs" --target tko_audit_sharing >/dev/null
ctest --test-dir build-test-audit --output-on-failure -L audit
echo "== packaging: install to a temporary prefix, link the examples (scripts/ci_install.sh)"
scripts/ci_install.sh
echo "== embedding: a host project with add_subdirectory, no Criterion (scripts/ci_embed.sh)"
scripts/ci_embed.sh
echo "== ABI: against the last release's (scripts/ci_abi.sh)"
scripts/ci_abi.sh
echo "== reference documentation: Doxygen, no undocumented public symbol (scripts/ci_docs.sh)"
scripts/ci_docs.sh
echo "== coverage of src/ by the plain suites (gcovr; gate in scripts/coverage.sh)"
scripts/coverage.sh
if [ "${TKO_SKIP_MUTANTS:-0}" = 1 ]; then
  echo "== mutation testing skipped (TKO_SKIP_MUTANTS=1)"
else
  echo "== mutation testing (scripts/mutants.list; every mutant must be killed)"
  scripts/mutants.sh
fi
echo "== fuzzing (libFuzzer, ASan+UBSan; ${FUZZ_SECONDS:-30} s per harness)"
FUZZ_SECONDS=${FUZZ_SECONDS:-30} scripts/fuzz.sh
echo "== all test flavours and the fuzzers passed"
