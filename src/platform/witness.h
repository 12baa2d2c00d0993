/* SPDX-License-Identifier: MIT */
/* Lock ranks and the lock-order checker ("witness", after jemalloc's
 * witness.h): the one place that orders every lock of the library.
 *
 * The rule: a thread may take a lock only while every lock it holds ranks
 * before it (a smaller rank), and takes nothing at all while it holds a
 * leaf (a rank from TKO__RANK_LEAF on). Two locks of one rank (two lanes'
 * mutexes) are never held together. A condition wait holds only the
 * mutex it waits with: waiting while holding another lock would block
 * that lock's other users for as long as the wait lasts. No lock is held
 * while a task, a hook, a callback of the host (flush, on_cancel) or an
 * attachment's close runs; shutdown holds none while it waits.
 *
 * Every library mutex is a tko__mutex, whose rank is bound once, where it
 * is initialised (tko__mutex_init, TKO__MUTEX_INITIALIZER, as jemalloc's
 * malloc_mutex_init), and every lock is taken through the wrappers below,
 * which read the rank from the mutex: no call site names one, so none can
 * name the wrong one (the queue's spinlock, the only tko__lock, takes
 * TKO__RANK_QUEUE in lock.h). In a build with TKO_LOCK_ORDER_CHECK (CMake's
 * option of that name: on for Debug and the sanitizer builds, so CI's TSan
 * and ASan flavours run every test with it) each thread keeps the ranks it
 * holds, and a violation - a lock taken out of order, one released or
 * waited on that the thread does not hold, a wait holding another lock -
 * prints both ranks and aborts. Checked before the lock is taken, so an
 * inversion is reported the first time it happens, not only when it
 * deadlocks. Without the option the wrappers are the bare pthread calls.
 *
 * Platform layer: extensions (the lane_*.c files, coalescer.c) include it too. */
#ifndef TKO_WITNESS_H
#define TKO_WITNESS_H

#include <pthread.h>
#include <time.h>

/* Outermost first. A lock's role and what it is held across: */
typedef enum tko__rank {
  TKO__RANK_NONE = 0, /* no lock (a report's "held" when nothing was) */
  /* pool.h: keyed_mu, the making of the pool's keyed table: held while the
   * table is made (the host's allocator, the pool's gate_mu), and taken
   * with no other lock held. */
  TKO__RANK_KEYED,
  /* lane.h: one lane's mu (its ring and flags). Held while the lane
   * submits its runner to the pool, so it ranks before every engine lock,
   * and while it updates the lanes' pending count (TKO__RANK_LANES_IDLE). */
  TKO__RANK_LANE,
  /* pool.h: spawn_mu, the slots' threads and states, the resize
   * targets (elastic.c, resize.c). Held while checking the queue. */
  TKO__RANK_SPAWN,
  /* pool.h: lock, the queue's spinlock (lock.h). */
  TKO__RANK_QUEUE,
  /* pool.h: help_mu, the helping waits listed to sleep (group.c); a
   * waker unparks them under it (a parker's fallback mutex). */
  TKO__RANK_HELP,
  /* group.c: a group's mu, its count, status and helpers; the last member
   * unparks the helpers under it (a parker's fallback mutex). */
  TKO__RANK_GROUP,
  /* Leaves: nothing is taken while one is held. */
  TKO__RANK_LEAF,
  TKO__RANK_GATE = TKO__RANK_LEAF, /* pool.h: gate_mu, the lifecycle (lifecycle.c) */
  TKO__RANK_IDLE_WAIT,  /* pool.h: idle_mu, wait_idle's and shutdown's waiters */
  TKO__RANK_TIMER,      /* pool.h: timer_mu, the timers' heap and records */
  TKO__RANK_TIMER_GRACE, /* timer.c: grace_mu, one destroy at a time waits for cancels */
  TKO__RANK_ASYNC,      /* pool.h: async_mu, the async records' free list */
  TKO__RANK_PARKER,     /* tko_signal.h: a parker's fallback mu (no futex) */
  TKO__RANK_LANES_IDLE, /* lane.h: idle_mu, the lanes' pending and runner counts */
  TKO__RANK_COALESCER,  /* coalescer.c: mu, the dirty tables and the sweep token */
  TKO__RANK_RINGS,      /* ring.h: the submit rings' mu, their claims and close */
  TKO__RANK_WORD_WAIT,  /* futex.c: a word wait's stripe mu (no futex: tko__word_wait) */
  TKO__RANK_COUNT
} tko__rank;

#ifdef TKO_LOCK_ORDER_CHECK
/* The calling thread is about to take a lock of rank r: checks the order,
 * then counts r as held. */
void tko__witness_acquire(tko__rank r);
/* The calling thread releases a lock of rank r: checks that it holds one. */
void tko__witness_release(tko__rank r);
/* The calling thread waits on a condition with the mutex of rank r. */
void tko__witness_wait(tko__rank r);
/* The calling thread is about to run the host's code (a task, a hook, a
 * batch callback, on_cancel): checks that it holds no lock. */
void tko__witness_assert_none_held(void);
/* A rank's name, for reports ("spawn_mu"). */
const char *tko__rank_name(tko__rank r);

/* What a report found. */
enum {
  TKO__WITNESS_ORDER = 1,
  TKO__WITNESS_NOT_HELD,
  TKO__WITNESS_WAIT_HOLDING,
  TKO__WITNESS_HOST_UNDER_LOCK /* host code about to run with a lock held */
};
/* Test seam: when set, a violation calls it instead of printing and
 * aborting (tests/unit/test_witness.c); held is TKO__RANK_NONE for
 * NOT_HELD, r is TKO__RANK_NONE for HOST_UNDER_LOCK. Never set by the
 * library. */
typedef void (*tko__witness_fn)(int what, tko__rank held, tko__rank r);
#ifdef TKO_TEST_SEAMS
extern _Atomic(tko__witness_fn) tko__test_witness_hook;
#endif
#else
static inline void tko__witness_acquire(tko__rank r) { (void)r; }
static inline void tko__witness_release(tko__rank r) { (void)r; }
static inline void tko__witness_wait(tko__rank r) { (void)r; }
static inline void tko__witness_assert_none_held(void) {}
#endif

/* A library mutex and, in a checker build only, its rank: a release build
 * keeps the bare pthread_mutex_t and pays nothing for the rank. */
typedef struct tko__mutex {
  pthread_mutex_t mu;
#ifdef TKO_LOCK_ORDER_CHECK
  tko__rank rank; /* I: set by tko__mutex_init or TKO__MUTEX_INITIALIZER */
#endif
} tko__mutex;

#ifdef TKO_LOCK_ORDER_CHECK
#define TKO__MUTEX_INITIALIZER(r) {PTHREAD_MUTEX_INITIALIZER, (r)}
#else
#define TKO__MUTEX_INITIALIZER(r) {PTHREAD_MUTEX_INITIALIZER}
#endif

/* Initialises m with the rank r, the one place r is named: 0, or
 * pthread_mutex_init's error. */
static inline int tko__mutex_init(tko__mutex *m, tko__rank r) {
#ifdef TKO_LOCK_ORDER_CHECK
  m->rank = r;
#else
  (void)r;
#endif
  return pthread_mutex_init(&m->mu, NULL);
}

static inline void tko__mutex_destroy(tko__mutex *m) { pthread_mutex_destroy(&m->mu); }

/* The rank m was initialised with (TKO__RANK_NONE without the checker,
 * which is then never asked). */
static inline tko__rank tko__mutex_rank(const tko__mutex *m) {
#ifdef TKO_LOCK_ORDER_CHECK
  return m->rank;
#else
  (void)m;
  return TKO__RANK_NONE;
#endif
}

static inline void tko__mutex_lock(tko__mutex *m) {
  tko__witness_acquire(tko__mutex_rank(m));
  pthread_mutex_lock(&m->mu);
}

static inline void tko__mutex_unlock(tko__mutex *m) {
  tko__witness_release(tko__mutex_rank(m));
  pthread_mutex_unlock(&m->mu);
}

/* The wait releases m and takes it back before it returns, so the thread
 * holds m's rank again, as the checker still counts it. */
static inline void tko__cond_wait(pthread_cond_t *cv, tko__mutex *m) {
  tko__witness_wait(tko__mutex_rank(m));
  pthread_cond_wait(cv, &m->mu);
}

static inline int tko__cond_timedwait(pthread_cond_t *cv, tko__mutex *m,
                                      const struct timespec *deadline) {
  tko__witness_wait(tko__mutex_rank(m));
  return pthread_cond_timedwait(cv, &m->mu, deadline);
}

#endif
