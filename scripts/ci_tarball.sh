#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI step: a build from a release tarball, the tree `git archive` gives (no
# .git), with every git command failing. Nothing of the build may depend
# on git: the version comes from CMakeLists.txt's project() (checked against
# include/taskorch.h at configure), and the tests that name versions or
# commits must pass there:
#   - bench_tools_run_all (benchmarks/run_all names a run's folder "nogit");
#   - test_errors' version checks, workbench_args (--version),
#     workbench_manpage, example_hello;
#   - and the tree installs.
# With TARBALL_README=1 it then runs the README's two commands there,
# scripts/demo.sh and scripts/test.sh, as a user of the tarball would (the
# whole suite plain, under TSan and under ASan: about ten minutes more).
# The tarball is the working tree's tracked files as they are now (committed
# or not; untracked files are left out, as from a release).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
step() { echo "== ci_tarball: $*"; }
fail() { echo "ci_tarball: $*" >&2; exit 1; }

step "git archive of the tracked files into $tmp/src"
rev=$(git stash create)
mkdir "$tmp/src"
git archive "${rev:-HEAD}" | tar -x -C "$tmp/src"
[ ! -e "$tmp/src/.git" ] || fail "the archive has a .git"

# From here on git fails wherever it is called: a stub first in PATH, and
# no repository above the tree for a real git to find.
mkdir "$tmp/bin"
printf '#!/bin/sh\necho "git: not available (scripts/ci_tarball.sh)" >&2\nexit 127\n' >"$tmp/bin/git"
chmod +x "$tmp/bin/git"
export PATH=$tmp/bin:$PATH GIT_CEILING_DIRECTORIES=$tmp GIT_DIR=$tmp/no-git
git --version >/dev/null 2>&1 && fail "git still answers"
cd "$tmp/src"

step "the version and run_all's folder without git"
dest=$(benchmarks/run_all --dry-run) || fail "run_all --dry-run exited $?"
grep -Eq "benchmarks/runs/[0-9]{8}-[0-9]{6}-nogit/RESULTS.md" <<<"$dest" ||
  fail "run_all's folder without git: $dest"

step "configure and build (plain)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTKO_WERROR=ON >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log" >&2; fail "configure failed"; }
if grep -iw 'git' "$tmp/configure.log"; then fail "the configure mentions git"; fi
cmake --build build -j "$(nproc)" --target taskorch taskorch_static taskorch-thpool taskorch-thpool_static \
  taskorch-workbench tko_test_errors tko_example_hello >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log" >&2; fail "build failed"; }

step "the tests that name versions or commits"
tests='^(bench_tools_run_all|test_errors|workbench_args|workbench_manpage|example_hello)$'
ctest --test-dir build -R "$tests" --output-on-failure >"$tmp/ctest.log" 2>&1 ||
  { cat "$tmp/ctest.log" >&2; fail "tests failed"; }
ran=$(grep -c ' Passed ' "$tmp/ctest.log" || true)
[ "$ran" = 5 ] || { cat "$tmp/ctest.log" >&2; fail "expected 5 tests to pass, $ran did"; }

step "install"
DESTDIR=$tmp/dest cmake --install build >/dev/null || fail "install failed"
find "$tmp/dest" -name taskorch.pc | grep -q . || fail "no taskorch.pc installed"
if [ "${TARBALL_README:-0}" = 1 ]; then
  step "the README's first command: scripts/demo.sh"
  scripts/demo.sh >"$tmp/demo.log" 2>&1 || { tail -20 "$tmp/demo.log" >&2; fail "scripts/demo.sh failed"; }
  [ -s demo.svg ] || fail "scripts/demo.sh wrote no demo.svg"
  step "the README's second command: scripts/test.sh"
  scripts/test.sh >"$tmp/test.log" 2>&1 || { tail -40 "$tmp/test.log" >&2; fail "scripts/test.sh failed"; }
  grep -E "tests passed|passed" "$tmp/test.log" | tail -3
fi
step "passed"
