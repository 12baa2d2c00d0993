/* SPDX-License-Identifier: MIT */
/* Helpers for the feature suites (groups, batch, bounded queue, aging,
 * blocking hint, timers, async), on top of tko_test_sync.h: a helper thread
 * whose int result the test can wait for without hanging, and a way to see
 * that a thread has gone to sleep in the kernel.
 *
 * Why the latter: a few tests must act only once another thread is blocked
 * inside the library (a submitter waiting for room, a worker waiting on its
 * group). The library offers no notification for "I am now blocked", so the
 * test reads the thread's state from /proc/self/task/TID/stat, as
 * tt_wait_thread_count_leq reads /proc for the thread count. That loop
 * observes the kernel, not a timer: no test sleeps for a fixed time. */
#ifndef TKO_TEST_FEATURE_H
#define TKO_TEST_FEATURE_H

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "taskorch.h"
#include "tko_test_sync.h"

static inline pid_t tf_gettid(void) {
  return (pid_t)syscall(SYS_gettid);
}

/* The one-letter state of thread tid of this process ('R', 'S', 'D', ...),
 * or 0 if it cannot be read. */
static inline char tf_thread_state(pid_t tid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* "tid (comm) S ...": comm may hold spaces or parentheses, so find the
   * last ')'. */
  char *p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p[2] : 0;
}

/* Waits until thread tid is asleep (state S or D); false after ~10 s. A
 * thread blocked on a condition variable or a futex shows 'S'. */
static inline bool tf_wait_thread_sleeping(pid_t tid) {
  uint64_t end = tt_now_ns() + 10ull * 1000000000u;
  for (;;) {
    char s = tf_thread_state(tid);
    if (s == 'S' || s == 'D') return true;
    if (tt_now_ns() >= end) return false;
    sched_yield();
  }
}

/* Waits until thread tid of this process has ended and left /proc (the
 * kernel removes it once it has run its last instruction); false after
 * TT_LONG_MS. */
static inline bool tf_wait_thread_gone(pid_t tid) {
  uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
  for (;;) {
    if (tf_thread_state(tid) == 0) return true;
    if (tt_now_ns() >= end) return false;
    sched_yield();
  }
}

/* The pool's stats, by value. */
static inline tko_stats tf_stats(tko_pool *pool) {
  tko_stats s;
  tko_pool_stats(pool, &s);
  return s;
}

/* Reads the pool's stats into *s until holds(s), or TT_LONG_MS passed;
 * returns whether it held. For figures that settle after tko_pool_wait_idle
 * returns: wait_idle waits for tasks, and a worker updates some figures
 * after its task counts as finished (a blocking hint ends, a thread that a
 * task ended is counted gone, a spawn on its way counts itself). No event
 * announces those, so this re-reads, as tt_wait_thread_count_leq does. */
static inline bool tf_stats_wait(tko_pool *pool, tko_stats *s, bool (*holds)(const tko_stats *s)) {
  uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
  for (;;) {
    tko_pool_stats(pool, s);
    if (holds(s)) return true;
    if (tt_now_ns() >= end) return false;
    sched_yield();
  }
}

/* A helper thread running fn(arg) once; the test waits for its int result
 * with a deadline, so a hang inside the library fails an assertion instead
 * of the whole run. */
typedef struct tf_thread {
  pthread_t thread;
  int (*fn)(void *arg);
  void *arg;
  pid_t tid;          /* set before fn runs (guarded by mu) */
  pthread_mutex_t mu; /* protects tid, started, done, result */
  pthread_cond_t cv;  /* broadcast when started or done changes */
  bool started, done;
  int result;
} tf_thread;

static inline void *tf_thread_main(void *p) {
  tf_thread *t = p;
  pthread_mutex_lock(&t->mu);
  t->tid = tf_gettid();
  t->started = true;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  int r = t->fn(t->arg);
  pthread_mutex_lock(&t->mu);
  t->result = r;
  t->done = true;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

/* Starts the thread and waits until it has recorded its tid. */
static inline int tf_thread_start(tf_thread *t, int (*fn)(void *), void *arg) {
  memset(t, 0, sizeof *t);
  t->fn = fn;
  t->arg = arg;
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  int rc = pthread_create(&t->thread, NULL, tf_thread_main, t);
  if (rc) return rc;
  pthread_mutex_lock(&t->mu);
  while (!t->started)
    pthread_cond_wait(&t->cv, &t->mu);
  pthread_mutex_unlock(&t->mu);
  return 0;
}

static inline bool tf_thread_is_done(tf_thread *t) {
  pthread_mutex_lock(&t->mu);
  bool d = t->done;
  pthread_mutex_unlock(&t->mu);
  return d;
}

/* Waits up to ms for the thread to finish; true (and *result set, thread
 * joined) if it did. On false the thread is left running: the caller fails
 * an assertion and the process ends. */
static inline bool tf_thread_join_within(tf_thread *t, long ms, int *result) {
  struct timespec dl;
  tt_deadline(&dl, ms);
  bool ok = true;
  pthread_mutex_lock(&t->mu);
  while (!t->done && ok)
    ok = pthread_cond_timedwait(&t->cv, &t->mu, &dl) != ETIMEDOUT;
  ok = t->done;
  if (ok && result) *result = t->result;
  pthread_mutex_unlock(&t->mu);
  if (!ok) return false;
  pthread_join(t->thread, NULL);
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->mu);
  return true;
}

static inline bool tf_thread_join(tf_thread *t, int *result) {
  return tf_thread_join_within(t, TT_LONG_MS, result);
}

#endif
