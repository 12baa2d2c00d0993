/* SPDX-License-Identifier: MIT */
/* Internal invariants: counts that must never go below zero, states that
 * only move forward, a queue's length. TKO__INVARIANT(cond) is checked in
 * the builds that check the lock order (CMake's TKO_LOCK_ORDER_CHECK: on
 * for Debug, for CI's TSan and ASan flavours, the fuzzers and the
 * mutants), whatever NDEBUG says - CI builds RelWithDebInfo, where
 * assert() is compiled out. A broken one prints the condition and where,
 * then aborts. Off, the condition is not evaluated and costs nothing.
 * Platform layer: any file may include it, extensions too. */
#ifndef TKO_INVARIANT_H
#define TKO_INVARIANT_H

#ifdef TKO_LOCK_ORDER_CHECK
#include <stdio.h>
#include <stdlib.h>

static inline _Noreturn void tko__invariant_broken(const char *cond, const char *file, int line) {
  fprintf(stderr, "taskorch: internal invariant broken at %s:%d: %s\n", file, line, cond);
  abort();
}
#define TKO__INVARIANT(cond) ((cond) ? (void)0 : tko__invariant_broken(#cond, __FILE__, __LINE__))
#else
#define TKO__INVARIANT(cond) ((void)sizeof(cond))
#endif

#endif
