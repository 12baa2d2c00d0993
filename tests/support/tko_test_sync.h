/* SPDX-License-Identifier: MIT */
/* Waiting helpers shared by the suites: a counter that threads can wait on,
 * a one-shot gate, the process's thread count from /proc, and the scale knob
 * that shrinks stress loops under sanitizers. Tests must never sleep to wait
 * for something, so every wait here is on a condition variable that the
 * awaited event signals; the deadlines only turn a hang (a bug) into a
 * failed assertion with a line number instead of a ctest timeout. */
#ifndef TKO_TEST_SYNC_H
#define TKO_TEST_SYNC_H

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

/* Sanitized builds run the same loops with fewer iterations: TSan and ASan
 * slow every memory access and would push the suite far past its budget. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define TT_SANITIZED 1
#endif
#endif
#ifdef TT_SANITIZED
#define TT_SCALE(plain, sanitized) (sanitized)
#else
#define TT_SCALE(plain, sanitized) (plain)
#endif

/* A forked child ends with _exit, which skips the exit handlers that write
 * gcov's counters: in a coverage build (TT_COVERAGE, tests/CMakeLists.txt)
 * the child writes them first, so that the calls it checked count in the
 * report (a copied pool's -ECHILD paths run only in children). */
#ifdef TT_COVERAGE
void __gcov_dump(void);
#endif

static inline _Noreturn void tt_child_exit(int code) {
#ifdef TT_COVERAGE
  __gcov_dump();
#endif
  _exit(code);
}

/* Generous upper bound for any wait in the suites: reaching it means a hang. */
#define TT_LONG_MS 60000L

static inline void tt_deadline(struct timespec *ts, long ms) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

static inline uint64_t tt_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A counter guarded by a mutex; every change wakes the waiters. It also keeps
 * the largest value it ever held, which the elastic tests use for
 * "concurrently alive" maxima. */
typedef struct tt_count {
  pthread_mutex_t mu; /* protects v and max */
  pthread_cond_t cv;  /* signalled on every change of v */
  long v, max;
} tt_count;

#define TT_COUNT_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0}

static inline void tt_count_init(tt_count *c) {
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  c->v = c->max = 0;
}

static inline void tt_count_fini(tt_count *c) {
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
}

static inline long tt_count_add(tt_count *c, long d) {
  pthread_mutex_lock(&c->mu);
  long v = c->v += d;
  if (v > c->max) c->max = v;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return v;
}

static inline long tt_count_get(tt_count *c) {
  pthread_mutex_lock(&c->mu);
  long v = c->v;
  pthread_mutex_unlock(&c->mu);
  return v;
}

static inline long tt_count_max(tt_count *c) {
  pthread_mutex_lock(&c->mu);
  long v = c->max;
  pthread_mutex_unlock(&c->mu);
  return v;
}

/* Waits until the counter is at least `target`; false if ms passed. */
static inline bool tt_count_wait_geq_within(tt_count *c, long target, long ms) {
  struct timespec dl;
  tt_deadline(&dl, ms);
  bool ok = true;
  pthread_mutex_lock(&c->mu);
  while (c->v < target && ok) ok = pthread_cond_timedwait(&c->cv, &c->mu, &dl) != ETIMEDOUT;
  ok = c->v >= target;
  pthread_mutex_unlock(&c->mu);
  return ok;
}

/* Waits until the counter is at least `target`; false if TT_LONG_MS passed. */
static inline bool tt_count_wait_geq(tt_count *c, long target) {
  return tt_count_wait_geq_within(c, target, TT_LONG_MS);
}

/* Waits until the counter equals `target` exactly. */
static inline bool tt_count_wait_eq(tt_count *c, long target) {
  struct timespec dl;
  tt_deadline(&dl, TT_LONG_MS);
  bool ok = true;
  pthread_mutex_lock(&c->mu);
  while (c->v != target && ok) ok = pthread_cond_timedwait(&c->cv, &c->mu, &dl) != ETIMEDOUT;
  ok = c->v == target;
  pthread_mutex_unlock(&c->mu);
  return ok;
}

/* A gate that tasks block on until the test opens it. */
typedef struct tt_gate {
  pthread_mutex_t mu; /* protects open */
  pthread_cond_t cv;  /* broadcast when the gate opens */
  bool open;
} tt_gate;

#define TT_GATE_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false}

static inline void tt_gate_open(tt_gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Blocks until the gate opens; false if TT_LONG_MS passed first. */
static inline bool tt_gate_wait(tt_gate *g) {
  struct timespec dl;
  tt_deadline(&dl, TT_LONG_MS);
  bool ok = true;
  pthread_mutex_lock(&g->mu);
  while (!g->open && ok) ok = pthread_cond_timedwait(&g->cv, &g->mu, &dl) != ETIMEDOUT;
  ok = g->open;
  pthread_mutex_unlock(&g->mu);
  return ok;
}

/* A task that holds its worker until the gate opens; started counts it in,
 * so the test knows the worker is taken. */
typedef struct tt_pin {
  tt_gate gate;
  tt_count started;
} tt_pin;

#define TT_PIN_INIT {TT_GATE_INIT, TT_COUNT_INIT}

static inline int tt_pin_fn(void *arg) {
  tt_pin *p = arg;
  tt_count_add(&p->started, 1);
  tt_gate_wait(&p->gate);
  return 0;
}

/* A task that does nothing. */
static inline int tt_nop_fn(void *arg) {
  (void)arg;
  return 0;
}

/* Threads in this process, from /proc/self/task (Linux); -1 if unreadable. */
static inline int tt_thread_count(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

/* Returns the thread count once it is at most `limit`, or the last count
 * read after ~10 s. The kernel removes an exited thread from /proc
 * asynchronously, after pthread_join has already returned, so a short
 * re-read loop is waiting on the kernel, not on the library. */
static inline int tt_wait_thread_count_leq_within(int limit, long ms) {
  uint64_t end = tt_now_ns() + (uint64_t)ms * 1000000u;
  int n;
  while ((n = tt_thread_count()) > limit && tt_now_ns() < end) sched_yield();
  return n;
}
static inline int tt_wait_thread_count_leq(int limit) {
  return tt_wait_thread_count_leq_within(limit, 10000);
}

/* A scene whose precondition is a matter of timing (a backlog that must
 * outlast a submitting thread, a pool that must not sit idle for a period)
 * can lose it when the machine preempts a thread at the wrong moment. Such
 * a scene is a function that returns true when its precondition held (and
 * it then asserted what it tests) and false when it did not (it asserted
 * nothing of the behaviour, and cleaned up). tt_rerun runs it again on
 * false, at most TT_ATTEMPTS times, and returns whether one attempt met its
 * precondition: the test asserts that, so it never passes vacuously. */
#define TT_ATTEMPTS 10

static inline bool tt_rerun(bool (*scene)(void *arg), void *arg) {
  for (int attempt = 0; attempt < TT_ATTEMPTS; attempt++)
    if (scene(arg)) return true;
  return false;
}

/* Spins (without sleeping) for at least ns nanoseconds of monotonic time. */
static inline void tt_spin_ns(uint64_t ns) {
  uint64_t end = tt_now_ns() + ns;
  while (tt_now_ns() < end) {
  }
}

/* Small deterministic PRNG (xorshift64*) so every run sees the same data. */
static inline uint64_t tt_rand(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

#endif
