#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CTest locks_ranked: every lock of the library is taken, released and
# waited on through src/platform/witness.h's wrappers, which name its rank, so a
# lock added later cannot escape the lock-order checker unranked.
# Usage: tests/check_locks_ranked.sh SOURCE_DIR
set -euo pipefail
cd "$1"
if grep -nE 'pthread_(mutex_(lock|trylock|timedlock|unlock)|cond_(timed)?wait)[[:space:]]*\(' \
     src/*/*.c src/*/*.h | grep -v '^src/platform/witness\.h:'; then
  echo "the calls above bypass src/platform/witness.h: take the lock with its rank" \
       "(tko__mutex_lock/unlock, tko__cond_wait/timedwait)" >&2
  exit 1
fi
