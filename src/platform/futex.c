/* SPDX-License-Identifier: MIT */
/* Waiting (prim.h): the monotonic clock and deadlines that timed waits
 * measure by, the one timed condition-variable loop, and the one-word
 * waits: futex(2) on Linux, a striped table of mutex and condition pairs
 * elsewhere. Kept apart from threads so that the wake-up protocols that
 * sleep on a word (signal.c, handle.c) have one small file to read. */
#define _GNU_SOURCE
#include "prim.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#ifdef TKO_HAVE_FUTEX
#include <linux/futex.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#endif

uint64_t tko__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void tko__deadline_after(struct timespec *ts, long ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

bool tko__time_before(const struct timespec *a, const struct timespec *b) {
  return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

int tko__cond_wait_until(pthread_cond_t *cv, tko__mutex *mu, const struct timespec *deadline,
                         bool (*done)(void *ctx), void *ctx) {
  while (!done(ctx)) {
    if (!deadline) tko__cond_wait(cv, mu);
    else if (tko__cond_timedwait(cv, mu, deadline) == ETIMEDOUT)
      return done(ctx) ? 0 : -ETIMEDOUT;
  }
  return 0;
}

#ifdef TKO_HAVE_FUTEX
void tko__futex_wait(atomic_uint *word, unsigned expected, uint64_t timeout_ns) {
  struct timespec ts, *tsp = NULL;
  if (timeout_ns != UINT64_MAX) {
    ts.tv_sec = (time_t)(timeout_ns / 1000000000u);
    ts.tv_nsec = (long)(timeout_ns % 1000000000u);
    tsp = &ts;
  }
  /* A relative timeout; EINTR, EAGAIN and ETIMEDOUT all just return, and the
   * caller re-checks the word. */
  syscall(SYS_futex, (void *)word, FUTEX_WAIT_PRIVATE, expected, tsp, NULL, 0);
}

void tko__futex_wake_one(atomic_uint *word) {
  syscall(SYS_futex, (void *)word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void tko__word_wait(atomic_uint *word, unsigned expected, uint64_t timeout_ns) {
  tko__futex_wait(word, expected, timeout_ns);
}

void tko__word_wake_all(atomic_uint *word) {
  syscall(SYS_futex, (void *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
#else
/* The fallback's pairs: process-wide by nature, as a futex table is; no
 * pool depends on another through them (a shared pair costs a spurious
 * wake at most). Made on first use; their condition variables use the
 * default clock, CLOCK_REALTIME, which any platform has. */
enum { WORD_STRIPES = 64 };
static struct word_stripe {
  tko__mutex mu; /* guards the sleep on cv: see prim.h */
  pthread_cond_t cv;
} word_stripes[WORD_STRIPES];
static pthread_once_t word_once = PTHREAD_ONCE_INIT;

static void word_stripes_init(void) {
  for (unsigned i = 0; i < WORD_STRIPES; i++) {
    (void)tko__mutex_init(&word_stripes[i].mu, TKO__RANK_WORD_WAIT);
    pthread_cond_init(&word_stripes[i].cv, NULL);
  }
}

static struct word_stripe *stripe_of(const atomic_uint *word) {
  pthread_once(&word_once, word_stripes_init);
  return &word_stripes[tko__mix64((uint64_t)(uintptr_t)word) % WORD_STRIPES];
}

void tko__word_wait(atomic_uint *word, unsigned expected, uint64_t timeout_ns) {
  struct word_stripe *st = stripe_of(word);
  tko__mutex_lock(&st->mu);
  /* seq_cst: after the lock, so a change made before the waker's lock of
   * this mutex is seen here, or its broadcast finds this thread asleep. */
  if (atomic_load(word) == expected) {
    if (timeout_ns == UINT64_MAX) {
      tko__cond_wait(&st->cv, &st->mu);
    } else {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      uint64_t ns = (uint64_t)ts.tv_nsec + timeout_ns % 1000000000u;
      ts.tv_sec += (time_t)(timeout_ns / 1000000000u + ns / 1000000000u);
      ts.tv_nsec = (long)(ns % 1000000000u);
      (void)tko__cond_timedwait(&st->cv, &st->mu, &ts);
    }
  }
  tko__mutex_unlock(&st->mu);
}

void tko__word_wake_all(atomic_uint *word) {
  struct word_stripe *st = stripe_of(word);
  tko__mutex_lock(&st->mu);
  pthread_cond_broadcast(&st->cv);
  tko__mutex_unlock(&st->mu);
}
#endif
