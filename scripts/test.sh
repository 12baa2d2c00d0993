#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's test command: builds and runs the whole test suite three
# times, plain, under ThreadSanitizer and under AddressSanitizer+UBSan.
# Installs its own packages first (scripts/deps.sh; TKO_SKIP_DEPS=1 skips
# that). Any failure stops it with a non-zero exit. CI (.ci/run) runs this
# and then the other gates (scripts/ci.sh).
#
# The build of the next flavour runs beside the tests of the current one:
# a test binary keeps well under the machine's cores busy, most of its time
# waiting for its workers, so the compiler takes the rest. The tests keep
# ctest -j1 (each Criterion binary runs two tests at a time itself).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
source scripts/flavour.sh

flavours=(plain thread address)
tko_flavour_build "${flavours[0]}"
for i in "${!flavours[@]}"; do
  next=${flavours[i + 1]:-}
  pid=
  if [ -n "$next" ]; then
    tko_flavour_build "$next" &
    pid=$!
  fi
  status=0
  tko_flavour_test "${flavours[i]}" || status=$?
  if [ -n "$pid" ]; then wait "$pid" || { echo "== $next: build failed" >&2; exit 1; }; fi
  [ "$status" = 0 ] || exit "$status"
done
echo "== the suite passed plain, under TSan and under ASan+UBSan"
