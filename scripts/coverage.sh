#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Coverage gate: builds with -DTKO_COVERAGE=ON (gcc --coverage, -O0) in
# build-coverage, runs the plain test suites, and reports line and branch
# coverage of src/ with gcovr: a summary here, the full report in
# build-coverage/coverage/ (index.html, summary.txt). Fails when either
# figure is below its threshold.
set -euo pipefail
cd "$(dirname "$0")/.."

# The gate: main measures about a point of branches above it (docs/TESTING.md
# has the figures and their date), so a change that adds code without tests
# fails it, not run-to-run variation; a change that adds tests may raise the
# thresholds here. Branches are counted without the unwinding edges that
# -fexceptions gives every call in run.c, take.c, worker.c, keyed.c and
# lane_runner.c
# (--exclude-throw-branches): they are not decisions of the source.
LINE_MIN=${TKO_COVERAGE_LINE_MIN:-97.6}
BRANCH_MIN=${TKO_COVERAGE_BRANCH_MIN:-91.9}

dir=build-coverage
jobs=$(nproc)
# A stale build directory must not reach gcovr: an object that is no longer
# built (a source renamed or removed, a target restructured) keeps its .gcno,
# and an old .gcno of a source that is still built makes gcovr 5 stop with an
# AssertionError when it merges the two (a function on two lines). Such
# objects come only from a change to the set of source files, to the build
# files or to the compiler, so the build starts clean when their fingerprint
# differs from the one it was made from; an edit inside a source just
# rebuilds its object, .gcno included.
fingerprint=$( {
  find . \( -path './build*' -o -path './.git' \) -prune -o \
    \( -name '*.[ch]' -o -name CMakeLists.txt -o -name '*.cmake' \) -print | LC_ALL=C sort
  find . \( -path './build*' -o -path './.git' \) -prune -o \
    \( -name CMakeLists.txt -o -name '*.cmake' \) -print0 | LC_ALL=C sort -z | xargs -0 cat
  ${CC:-cc} --version
} | sha256sum)
if [ "$(cat "$dir/fingerprint" 2>/dev/null)" != "$fingerprint" ]; then
  rm -rf "$dir"
  mkdir -p "$dir"
fi
gen=() # Ninja for a new folder; a folder made before keeps its generator
if [ ! -f "$dir/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then gen=(-G Ninja); fi
cmake -S . -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTKO_COVERAGE=ON -DTKO_BUILD_TESTS=ON \
  -DTKO_BUILD_BENCHMARKS=OFF -DTKO_BUILD_WORKBENCH=OFF >/dev/null
cmake --build "$dir" -j "$jobs" >/dev/null
echo "$fingerprint" >"$dir/fingerprint" # after the build: a failed one starts clean again
find "$dir" -name '*.gcda' -delete # counts from this run only
ctest --test-dir "$dir" --output-on-failure -j 1
mkdir -p "$dir/coverage"
gcovr --root . --object-directory "$dir" --filter 'src/' --exclude-throw-branches \
  --txt "$dir/coverage/summary.txt" --html-details "$dir/coverage/index.html" \
  --print-summary --fail-under-line "$LINE_MIN" --fail-under-branch "$BRANCH_MIN" || {
  echo "coverage: below the gate (lines >= $LINE_MIN%, branches >= $BRANCH_MIN%);" \
       "uncovered lines are in $dir/coverage/summary.txt" >&2
  exit 1
}
echo "coverage: gate passed (lines >= $LINE_MIN%, branches >= $BRANCH_MIN%);" \
     "report in $dir/coverage/index.html"
