#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI step: a packager's build on a machine without Criterion. pkg-config
# sees every .pc file of this machine except criterion.pc (the other
# optional dependencies stay found), and:
#   - a plain top-level configure succeeds, says in one line that the tests
#     are not built, and has no test targets; a second configure of the same
#     tree decides the same way;
#   - the libraries and the workbench build;
#   - an explicit -DTKO_BUILD_TESTS=ON fails, naming libcriterion-dev;
#   - the TSan flavour, whose tests use the stand-in runner, still
#     configures its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
step() { echo "== ci_no_criterion: $*"; }
fail() { echo "ci_no_criterion: $*" >&2; exit 1; }

# A pkg-config search path of links to every .pc file but Criterion's.
mkdir "$tmp/pc"
IFS=: read -r -a pc_dirs <<<"$(pkg-config --variable pc_path pkg-config)"
for d in "${pc_dirs[@]}" ${PKG_CONFIG_PATH:+${PKG_CONFIG_PATH//:/ }}; do
  [ -d "$d" ] || continue
  for f in "$d"/*.pc; do
    # The first of a name wins, as in pkg-config's own search.
    name=$(basename "$f")
    [ -e "$f" ] && [ "$name" != criterion.pc ] && [ ! -e "$tmp/pc/$name" ] && ln -s "$f" "$tmp/pc/"
  done
done
export PKG_CONFIG_LIBDIR=$tmp/pc
unset PKG_CONFIG_PATH
pkg-config --exists criterion && fail "Criterion is still visible"

step "a plain configure without Criterion"
cmake -S . -B "$tmp/build" -DTKO_WERROR=ON >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log" >&2; fail "configure without Criterion failed"; }
notice=$(grep -c 'Criterion not found (Debian: libcriterion-dev): tests not built' "$tmp/configure.log" || true)
[ "$notice" = 1 ] || { cat "$tmp/configure.log" >&2; fail "no one-line notice that the tests are skipped"; }
targets=$(cmake --build "$tmp/build" --target help)
if grep -E 'tko_test_|tko_example_' <<<"$targets"; then fail "test targets without Criterion"; fi
[ ! -e "$tmp/build/CTestTestfile.cmake" ] || fail "CTest entries without Criterion"
cmake "$tmp/build" >"$tmp/reconfigure.log" 2>&1 ||
  { cat "$tmp/reconfigure.log" >&2; fail "a second configure failed"; }
grep -q 'tests not built' "$tmp/reconfigure.log" || fail "a second configure changed its mind"

step "build the libraries and the workbench"
cmake --build "$tmp/build" -j "$(nproc)" --target taskorch taskorch_static taskorch-workbench \
  >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log" >&2; fail "build failed"; }
"$tmp/build/workbench/taskorch-workbench" --help >/dev/null || fail "taskorch-workbench --help"

step "-DTKO_BUILD_TESTS=ON without Criterion fails"
if cmake -S . -B "$tmp/build-on" -DTKO_BUILD_TESTS=ON >"$tmp/on.log" 2>&1; then
  fail "configure with -DTKO_BUILD_TESTS=ON succeeded without Criterion"
fi
grep -q 'TKO_BUILD_TESTS=ON: the tests need Criterion (Debian: libcriterion-dev)' "$tmp/on.log" ||
  { cat "$tmp/on.log" >&2; fail "the failure does not name libcriterion-dev"; }

step "the TSan flavour's stand-in runner needs no Criterion"
cmake -S . -B "$tmp/build-tsan" -DTKO_SANITIZE=thread -DTKO_BUILD_TESTS=ON \
  -DTKO_BUILD_BENCHMARKS=OFF >"$tmp/tsan.log" 2>&1 ||
  { cat "$tmp/tsan.log" >&2; fail "TSan configure with tests failed"; }
targets=$(cmake --build "$tmp/build-tsan" --target help)
grep -q tko_test_pool <<<"$targets" ||
  fail "the TSan flavour lost its tests"
step "passed"
