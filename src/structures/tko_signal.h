/* SPDX-License-Identifier: MIT */
/* The semaphore-style signal that idle workers sleep on: one parker (a
 * binary semaphore) per worker, a bitmap of the sleepers that a waker claims
 * one bit of with one atomic AND (no lock), and one atomic word counting
 * searching and sleeping workers so that a submit can tell, with a single
 * load, whether anyone needs waking. The protocol is explained at the top
 * of signal.c. */
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
#include "taskorch.h"

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

/* A worker's place in the idle set: its bit there, and the word that
 * settles who counts it searching once a waker claims it (signal.c). */
typedef struct tko__sleeper {
  tko__parker parker;
  unsigned bit;              /* I: its bit in tko__idle.asleep */
  atomic_uint_fast64_t turn; /* its sleep's round << 2 | TKO__TURN_* */
} tko__sleeper;

/* A sleep's turn word, low two bits: who counts a claimed sleeper
 * searching (signal.c). */
#define TKO__TURN_DONE 0u  /* counted (or never claimed) */
#define TKO__TURN_OPEN 1u  /* asleep or claimed, not yet counted */
#define TKO__TURN_WAKER 2u /* its waker is counting it */

int tko__sleeper_init(tko__sleeper *s, unsigned bit);
void tko__sleeper_fini(tko__sleeper *s);

/* searching in the low 32 bits, sleepers in the high 32. */
#define TKO__SEARCHING_ONE ((uint64_t)1)
#define TKO__SLEEPING_ONE ((uint64_t)1 << 32)

/* Bits in the idle set: one per slot a pool may have (resize.c). */
#define TKO__IDLE_BITS (TKO_MAX_WORKERS + TKO_MAX_ELASTIC)
#define TKO__IDLE_WORDS ((TKO__IDLE_BITS + 63) / 64)

typedef struct tko__idle {
  _Alignas(64) atomic_uint_fast64_t state; /* searching | sleepers << 32 */
  /* The idle set: bit i set = sleeper i is asleep and unclaimed. Only
   * sleeper i sets it; whoever clears it (a waker, or the sleeper's own
   * cancel) owns that sleep's wake-up. */
  _Alignas(64) atomic_uint_fast64_t asleep[TKO__IDLE_WORDS];
  unsigned nwords;      /* I: the words in use */
  tko__sleeper *first;  /* I: sleeper i is at first + i * stride bytes */
  size_t stride;        /* I */
} tko__idle;

/* n sleepers (bits 0 to n - 1, at most TKO__IDLE_BITS), sleeper i at
 * (char *)first + i * stride. */
void tko__idle_init(tko__idle *idle, tko__sleeper *first, size_t stride, unsigned n);

/* A worker starts looking for work (also counted for a new worker). */
void tko__idle_search_begin(tko__idle *idle);
/* A worker stops looking; true if it was the last one looking. */
bool tko__idle_search_end(tko__idle *idle);

/* A searching worker announces it will sleep. The caller must then re-check
 * for work and call tko__idle_sleep_cancel if it finds any, else
 * tko__idle_sleep. */
void tko__idle_sleep_prepare(tko__idle *idle, tko__sleeper *s);
/* Sleeps up to timeout_ns (UINT64_MAX: no limit). True: a waker claimed
 * it, and it is counted searching again. False: the time ran out; the
 * caller calls tko__idle_sleep_cancel. */
bool tko__idle_sleep(tko__idle *idle, tko__sleeper *s, uint64_t timeout_ns);
/* Ends an announced sleep; the caller is counted searching again when it
 * returns. True: it took itself out of the idle set. False: a waker had
 * claimed it, and this waited for that waker's permit and consumed it. */
bool tko__idle_sleep_cancel(tko__idle *idle, tko__sleeper *s);

/* Wakes one sleeper, the lowest-numbered (basic workers before elastic
 * ones), counting it as searching. Returns false, making no system call,
 * when nobody was asleep and unclaimed. */
bool tko__idle_wake_one(tko__idle *idle);
/* Wakes every sleeper (shutdown, a shrink). */
void tko__idle_wake_all(tko__idle *idle);

/* Where a waker is (the test seam below). */
enum tko__wake_point {
  TKO__WAKE_DECIDED, /* it saw a sleeper counted, before its scan */
  TKO__WAKE_SCANNED, /* it read a word with bits set, before its claim */
  TKO__WAKE_CLAIMED  /* it claimed a sleeper, before its unpark */
};
#ifdef TKO_TEST_SEAMS
/* Test seam: when set, tko__idle_wake_one calls it at each of those
 * points. NULL outside tests. */
extern void (*_Atomic tko__test_wake_window)(enum tko__wake_point at);
#endif

static inline uint32_t tko__idle_searching(uint64_t state) { return (uint32_t)state; }
static inline uint32_t tko__idle_sleeping(uint64_t state) { return (uint32_t)(state >> 32); }

#endif
