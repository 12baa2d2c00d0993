#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CTest error_codes_named: every error code the public headers document
# (-EXXX) has a name and a description in src/engine/error.c and is checked by
# tests/api/test_err_name.c, so a code added later cannot be missed.
# Usage: tests/check_error_codes.sh SOURCE_DIR
set -euo pipefail
cd "$1"
status=0
for code in $(grep -ohE -- '-E[A-Z]{3,}' include/taskorch.h include/taskorch/*.h compat/thpool.h |
              sort -u | sed 's/^-//'); do
  grep -q "{$code, \"$code\"," src/engine/error.c ||
    { echo "src/engine/error.c: no name for $code" >&2; status=1; }
  grep -q "CODE($code)" tests/api/test_err_name.c ||
    { echo "tests/api/test_err_name.c: $code not checked" >&2; status=1; }
done
exit $status
