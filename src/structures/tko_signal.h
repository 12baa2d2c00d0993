/* SPDX-License-Identifier: MIT */
/* The semaphore-style signal that idle workers sleep on: one parker (a
 * binary semaphore) per worker, a LIFO list of sleepers, and one atomic word
 * counting searching and sleeping workers so that a submit can tell, with a
 * single load, whether anyone needs waking. The protocol is explained at the
 * top of signal.c. */
#ifndef TKO_SIGNAL_H
#define TKO_SIGNAL_H
/* Layering: extensions (lanes, coalescer) use the public API and the
 * platform layer only; CMake compiles them with TKO_EXTENSION. */
#ifdef TKO_EXTENSION
#error "an extension includes an engine or data-structure header"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "prim.h"

/* A binary semaphore for one thread: unpark leaves a permit, park consumes
 * it, blocking until one arrives. */
typedef struct tko__parker {
  atomic_uint permit; /* 1 = a wake-up is waiting to be consumed */
#ifndef TKO_HAVE_FUTEX
  tko__mutex mu; /* protects the wait on cv; permit stays atomic */
  pthread_cond_t cv;
#endif
} tko__parker;

int tko__parker_init(tko__parker *pk);
void tko__parker_fini(tko__parker *pk);
/* Consumes the permit, waiting up to timeout_ns (UINT64_MAX = no limit).
 * Returns true if it consumed one, false on timeout. */
bool tko__parker_park(tko__parker *pk, uint64_t timeout_ns);
void tko__parker_unpark(tko__parker *pk);

/* One sleeper's entry in the idle list. */
typedef struct tko__sleeper {
  tko__parker parker;
  struct tko__sleeper *prev, *next; /* guarded by tko__idle.mu */
  bool listed;                      /* guarded by tko__idle.mu */
} tko__sleeper;

/* searching in the low 32 bits, sleepers in the high 32. */
#define TKO__SEARCHING_ONE ((uint64_t)1)
#define TKO__SLEEPING_ONE ((uint64_t)1 << 32)

typedef struct tko__idle {
  _Alignas(64) atomic_uint_fast64_t state; /* searching | sleepers << 32 */
  _Alignas(64) tko__mutex mu;              /* protects the list and every
                                              change to the sleeper count */
  tko__sleeper *top;                       /* most recently idle first */
} tko__idle;

int tko__idle_init(tko__idle *idle);
void tko__idle_fini(tko__idle *idle);

/* A worker starts looking for work (also counted for a new worker). */
void tko__idle_search_begin(tko__idle *idle);
/* A worker stops looking; true if it was the last one looking. */
bool tko__idle_search_end(tko__idle *idle);

/* A searching worker announces it will sleep. The caller must then re-check
 * for work and call tko__idle_sleep_cancel if it finds any. */
void tko__idle_sleep_prepare(tko__idle *idle, tko__sleeper *s);
/* Takes the caller off the list and makes it searching again. Returns false
 * if a waker got there first: its permit is on the way and the caller must
 * consume it with tko__parker_park (it is already counted as searching). */
bool tko__idle_sleep_cancel(tko__idle *idle, tko__sleeper *s);

/* Wakes the most recently idle sleeper, counting it as searching. Returns
 * false, making no system call, when nobody was asleep. */
bool tko__idle_wake_one(tko__idle *idle);
/* Wakes every sleeper (shutdown). */
void tko__idle_wake_all(tko__idle *idle);

static inline uint32_t tko__idle_searching(uint64_t state) { return (uint32_t)state; }
static inline uint32_t tko__idle_sleeping(uint64_t state) { return (uint32_t)(state >> 32); }

#endif
