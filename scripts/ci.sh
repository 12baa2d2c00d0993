#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The whole CI (.ci/run runs this): the README's test command
# (scripts/test.sh: the suite plain, under TSan and under ASan+UBSan), then
# every other gate, in the order below. Any failure stops it with a non-zero
# exit. A new gate is one more step at the end of the list, with an echo
# that names it and its script.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
step() { echo "== [$((SECONDS - start)) s] $*"; }

step "the README's test command (scripts/test.sh)"
scripts/test.sh
step "the README's first command (scripts/demo.sh): everything built Release, -Werror, and the demo run"
scripts/demo.sh >/dev/null
[ -s demo.svg ] || { echo "scripts/demo.sh wrote no demo.svg" >&2; exit 1; }
source scripts/flavour.sh

step "onequeue: the suite on pools of one queue (scripts/flavour.sh)"
tko_flavour_build onequeue
tko_flavour_test onequeue

step "release: the suite built Release, with link-time optimisation (scripts/flavour.sh)"
tko_flavour_build release
tko_flavour_test release

step "sharing audit: the instrumented build checks itself (benchmarks/MODEL.md)"
cmake -S . -B build-test-audit -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTKO_SHARING_AUDIT=ON -DTKO_WERROR=ON \
  -DTKO_BUILD_WORKBENCH=OFF >/dev/null
cmake --build build-test-audit -j "$tko_jobs" --target tko_audit_sharing >/dev/null
ctest --test-dir build-test-audit --output-on-failure -L audit

step "packaging: install to a temporary prefix, link the examples (scripts/ci_install.sh)"
scripts/ci_install.sh
step "embedding: a host project with add_subdirectory, no Criterion (scripts/ci_embed.sh)"
scripts/ci_embed.sh
step "ABI: against the last release's (scripts/ci_abi.sh)"
scripts/ci_abi.sh
step "reference documentation: Doxygen, no undocumented public symbol (scripts/ci_docs.sh)"
scripts/ci_docs.sh
step "coverage of src/ by the plain suites (gcovr; gate in scripts/coverage.sh)"
scripts/coverage.sh
step "mutation testing (scripts/mutants.list; every mutant must be killed)"
scripts/mutants.sh
step "fuzzing (libFuzzer, ASan+UBSan; ${FUZZ_SECONDS:-30} s per harness)"
FUZZ_SECONDS=${FUZZ_SECONDS:-30} scripts/fuzz.sh
step "building without Criterion: tests skipped with a notice, an explicit ON refused (scripts/ci_no_criterion.sh)"
scripts/ci_no_criterion.sh
step "a release tarball: no .git, no git (scripts/ci_tarball.sh)"
scripts/ci_tarball.sh
# Further gates go here, each as a step.
step "every gate passed"
