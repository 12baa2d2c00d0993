#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI step (run by scripts/test.sh): a host project (tests/host/) embeds this
# source tree with add_subdirectory, on a machine state where pkg-config
# finds nothing (so no Criterion, no jemalloc), and checks that taskorch
# stays out of the host's way:
#   - the configure succeeds and only the libraries are built (no tests,
#     benchmarks or workbench targets);
#   - no -Werror reaches any compile command (TKO_WERROR is off by default);
#   - the host's install installs the host's program and nothing of taskorch;
#   - the examples built by the host run;
#   - a host whose own flags are -Wall -Wextra -Wpedantic -Werror (they
#     reach taskorch's sources too) builds, under gcc and under clang (the
#     installed headers from C++ with -pedantic: scripts/ci_install.sh);
#   - with taskorch's tests (Criterion visible again) and benchmarks turned
#     on, its targets do not clash with a host's own test_pool and bench_cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
step() { echo "== ci_embed: $*"; }
fail() { echo "ci_embed: $*" >&2; exit 1; }

mkdir "$tmp/empty"
export PKG_CONFIG_LIBDIR=$tmp/empty # pkg-config finds no package at all
unset PKG_CONFIG_PATH
pkg-config --exists criterion && fail "Criterion is still visible"

step "configure and build tests/host with add_subdirectory($src)"
cmake -S tests/host -B "$tmp/host" -DTASKORCH_SOURCE_DIR="$src" \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$tmp/configure.log" ||
  { cat "$tmp/configure.log" >&2; fail "configure failed"; }
cmake --build "$tmp/host" -j "$(nproc)" >/dev/null
targets=$(cmake --build "$tmp/host" --target help)
if grep -E 'tko_test_|tko_bench_|tko_probe_|tko_example_|workbench' <<<"$targets"; then
  fail "taskorch's tests, benchmarks or workbench are built in a host"
fi
grep -q -- '-Werror' "$tmp/host/compile_commands.json" && fail "-Werror imposed on the host build"

step "run the host's programs"
"$tmp/host/host_hello" | grep -q "completed 3 of 3" || fail "host_hello"
"$tmp/host/host_hello_static" | grep -q "completed 3 of 3" || fail "host_hello_static"
"$tmp/host/host_thpool" | grep -q "(expected 20540)" || fail "host_thpool"

step "the host's install installs only the host's program"
cmake --install "$tmp/host" --prefix "$tmp/inst" >/dev/null
installed=$(cd "$tmp/inst" && find . -type f | sort)
[ "$installed" = "./bin/host_hello" ] || fail "installed more than the host's program: $installed"

for cc in gcc clang; do
  step "a host built with -Wall -Wextra -Wpedantic -Werror ($cc)"
  CC=$cc cmake -S tests/host -B "$tmp/host-$cc" -DTASKORCH_SOURCE_DIR="$src" \
    -DCMAKE_C_FLAGS="-Wall -Wextra -Wpedantic -Werror" >"$tmp/configure-$cc.log" ||
    { cat "$tmp/configure-$cc.log" >&2; fail "configure with $cc failed"; }
  cmake --build "$tmp/host-$cc" -j "$(nproc)" >"$tmp/build-$cc.log" 2>&1 ||
    { cat "$tmp/build-$cc.log" >&2; fail "a -Wpedantic -Werror host does not build with $cc"; }
  "$tmp/host-$cc/host_hello" | grep -q "completed 3 of 3" || fail "host_hello ($cc)"
done

step "taskorch's tests and benchmarks turned on beside host targets test_pool and bench_cpu"
env -u PKG_CONFIG_LIBDIR cmake -S tests/host -B "$tmp/host2" -DTASKORCH_SOURCE_DIR="$src" \
  -DHOST_GENERIC_NAMES=ON -DTKO_BUILD_BENCHMARKS=ON -DTKO_BUILD_TESTS=ON >"$tmp/configure2.log" 2>&1 ||
  { cat "$tmp/configure2.log" >&2; fail "configure with tests and benchmarks failed"; }
targets=$(cmake --build "$tmp/host2" --target help)
grep -q tko_bench_cpu <<<"$targets" && grep -q tko_test_pool <<<"$targets" ||
  fail "no tko_bench_cpu or tko_test_pool target"
step "passed"
