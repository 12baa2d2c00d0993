/* SPDX-License-Identifier: MIT */
/* The queue lock: a test-and-test-and-set spinlock that yields the core.
 *
 * Why not a pthread mutex: the critical sections are a few dozen
 * nanoseconds, and a contended mutex parks the loser in the kernel for
 * microseconds, which on a machine with fewer cores than threads turned one
 * producer and two workers into a convoy of context switches. A waiter here
 * spins briefly with a pause, then yields the core so that a preempted
 * holder can run (pause-spinning against a holder that shares the core only
 * burns its time slice).
 *
 * The pool's queue lock is the only tko__lock: it has the rank
 * TKO__RANK_QUEUE in the lock order (witness.h). */
#ifndef TKO_LOCK_H
#define TKO_LOCK_H

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "atomics.h"
#include "witness.h"

typedef struct tko__lock {
  atomic_int held;
  atomic_uint_fast64_t contended; /* slow-path entries, for benchmarks */
} tko__lock;

static inline void tko__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* One step of a bounded busy wait on another thread: a pause for the
 * first `pauses` steps, then a yield of the core, since the thread waited
 * for may be preempted and need it (pause-spinning against a thread that
 * shares the core only burns its time slice). */
static inline void tko__wait_step(unsigned step, unsigned pauses) {
  if (step < pauses) tko__cpu_relax();
  else sched_yield();
}

static inline void tko__lock_init(tko__lock *l) {
  atomic_init(&l->held, 0);
  atomic_init(&l->contended, 0);
}

static inline void tko__lock_slow(tko__lock *l) {
  tko__add_relaxed(&l->contended, 1);
  for (unsigned spins = 0;; spins++) {
    /* Relaxed: only a hint to retry the acquiring exchange below. */
    while (tko__load_relaxed(&l->held)) tko__wait_step(spins++, 32);
    /* Acquire: pairs with the release in tko__unlock. */
    if (!tko__exchange_acquire(&l->held, 1)) return;
  }
}

static inline void tko__lock_acquire(tko__lock *l) {
  tko__witness_acquire(TKO__RANK_QUEUE);
  /* Acquire: pairs with the release in tko__unlock. */
  if (tko__exchange_acquire(&l->held, 1)) tko__lock_slow(l);
  TKO__AUDIT_LOCKED(&l->held, 1); /* the sharing audit: a serialised section begins */
}

static inline void tko__unlock(tko__lock *l) {
  TKO__AUDIT_LOCKED(&l->held, -1);
  tko__witness_release(TKO__RANK_QUEUE);
  tko__store_release(&l->held, 0); /* pairs with the acquires above */
}

#endif
