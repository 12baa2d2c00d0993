#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CTest locks_ranked: every mutex of the library is a tko__mutex, given its
# rank where it is initialised (src/platform/witness.h: tko__mutex_init,
# TKO__MUTEX_INITIALIZER), and taken, released and waited on through the
# wrappers there, which read that rank; so a lock added later cannot escape
# the lock-order checker unranked.
# Usage: tests/check_locks_ranked.sh SOURCE_DIR
set -euo pipefail
cd "$1"
status=0
if grep -nE 'pthread_(mutex_(lock|trylock|timedlock|unlock)|cond_(timed)?wait)[[:space:]]*\(' \
     src/*/*.c src/*/*.h | grep -v '^src/platform/witness\.h:'; then
  echo "the calls above bypass src/platform/witness.h: take the lock through its wrappers" \
       "(tko__mutex_lock/unlock, tko__cond_wait/timedwait)" >&2
  status=1
fi
if grep -nE 'pthread_mutex_init[[:space:]]*\(|PTHREAD_MUTEX_INITIALIZER' \
     src/*/*.c src/*/*.h | grep -vE '^src/platform/witness\.[ch]:'; then
  echo "the mutexes above are made without a rank: make each a tko__mutex and initialise it" \
       "with tko__mutex_init(&m, rank) or TKO__MUTEX_INITIALIZER(rank) (src/platform/witness.h)" >&2
  status=1
fi
exit "$status"
