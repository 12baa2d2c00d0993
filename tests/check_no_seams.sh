#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Usage: check_no_seams.sh RELEASE_LIB... TEST_LIB
# Fails when a released library defines or references a test seam
# (tko__test_*, src/platform/seam.h), or when the test library has none (then the
# check itself would be blind).
set -euo pipefail
test_lib=${!#}
status=0
for lib in "${@:1:$#-1}"; do
  if found=$(nm -A "$lib" 2>/dev/null | grep 'tko__test_'); then
    echo "test seams in the released $lib:"
    echo "$found"
    status=1
  fi
done
if ! nm -A "$test_lib" | grep 'tko__test_' >/dev/null; then
  echo "no test seam in $test_lib: the check cannot see them"
  status=1
fi
[ "$status" = 0 ] && echo "no test seam in $(($# - 1)) released libraries"
exit "$status"
