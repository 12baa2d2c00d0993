/* SPDX-License-Identifier: MIT */
/* Delayed and periodic tasks: one min-heap of caller-owned timers per pool,
 * ordered by deadline, and one timer thread that sleeps until the earliest
 * deadline and submits what is due.
 *
 * Ownership: the pool touches a timer only under timer_mu while it is armed.
 * When one fires (or is cancelled) its fields are copied under the mutex and
 * its state changes before the mutex is released, so a caller may reuse or
 * free the storage as soon as it fires or tko_timer_cancel returns.
 *
 * Exactly once, for a periodic timer's argument: each firing is a task of
 * its own, and the timer is one more (the one that ends in on_cancel if
 * shutdown finds it armed). A host frees the argument in on_cancel, so it
 * must get there once, after the timer's last run. Three rules see to it:
 * - one firing at a time: a firing carries a pool-owned record, of a task
 *   kind (kind.h: tko__task_kind), that the engine reports back when
 *   the task has run or was cancelled (firing_done); while it is queued or
 *   running, the timer skips its periods;
 * - a firing the queue refuses (a full TKO_FULL_REJECT queue, no memory)
 *   skips its period: the argument stays the timer's, nothing reaches
 *   on_cancel (a one-shot timer has no next period: its task is cancelled
 *   once and the timer disarmed);
 * - a firing cancelled by shutdown hands the argument to on_cancel and ends
 *   the timer with it; otherwise shutdown hands each armed timer over when
 *   it closes the timers, last, once no firing can be out any more (below).
 * The record, not the caller's timer, is what a firing points to: a
 * cancelled timer's storage may be reused while its last firing still runs.
 *
 * Shutdown closes the timers last (timers_close, their phase's close:
 * lifecycle.h's TKO__PHASE_TIMERS, after the queue is drained or cancelled,
 * the workers are gone and in-flight async tasks have completed): until
 * then timers keep firing, and a task that comes due on a closed pool runs
 * on the timer thread, since it may be what completes an async task that
 * shutdown waits for. The phase is registered by the pool's first arm,
 * before the timer thread can start: a first arm during a shutdown is
 * accepted until the shutdown reaches the timers' phase.
 *
 * A cancel has no pool argument and may come at any time, a destroy
 * included (taskorch.h): it reaches the pool through the timer, and only
 * while the timer is armed. One that finds it armed takes timer_mu, in the
 * pool, so the pool must outlive it, though the shutdown may disarm the
 * timer and the destroy free the pool meanwhile. So a cancel counts itself
 * in a process-wide count of cancels in flight before it reads the state
 * again, and a destroy (timers_fini), its timers disarmed, waits for the
 * cancels counted before it looked: each either sees the timer disarmed
 * and leaves the pool alone, or is counted and waited for (seq_cst, both
 * sides: a Dekker pair). Two generations of the count, flipped by each
 * destroy, so that cancels that start during the wait (on other pools) do
 * not keep a destroy waiting: it waits only for the generation before its
 * flip (tests/unit/test_timer_cancel.c). */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "heap.h"
#include "kind.h"
#include "mem.h"
#include "seam.h"

enum { TIMER_IDLE = 0, TIMER_ARMED, TIMER_FIRED, TIMER_CANCELLED };

/* A periodic timer's link to its firing (see the essay above). Pool-owned,
 * taken from pool->timer_free when a periodic timer is armed; every field
 * is guarded by timer_mu. */
typedef struct tko__firing {
  const tko__task_kind *kind; /* I: firing_kind, first (tko__item_kind) */
  struct tko__timer *timer; /* the armed timer; NULL once it is disarmed */
  struct tko__firing *next_free;
  tko_pool *pool;
  bool outstanding; /* a firing is submitted and has not yet run or been cancelled */
} tko__firing;

typedef struct tko__timer {
  tko_task_fn fn;
  void *arg;
  tko_pool *pool;
  uint64_t deadline_ns, period_ns; /* period 0 = one-shot */
  tko__firing *rec;                /* periodic timers only; timer_mu */
  uint32_t heap_pos;
  int weight;
  /* Written under pool->timer_mu; atomic so that tko_timer_cancel can see
   * "not armed" without touching a pool that may be gone. */
  atomic_int state;
} tko__timer;

_Static_assert(sizeof(tko__timer) <= sizeof(tko_timer), "tko_timer too small");
_Static_assert(_Alignof(tko__timer) <= _Alignof(tko_timer), "tko_timer misaligned");

static int timers_close(tko_pool *pool, const struct timespec *deadline);
static void timers_fini(tko_pool *pool);
static const tko__phase timer_phase = {
    .number = TKO__PHASE_TIMERS, .close = timers_close, .fini = timers_fini};

/* Cancels in flight, by generation (see the essay): a cancel counts itself
 * in cancels_in[cancel_gen & 1]; a destroy flips cancel_gen under grace_mu
 * (one destroy at a time waits) and waits for the old count to empty. */
static atomic_uint cancel_gen;
static atomic_uint_fast64_t cancels_in[2];
static tko__mutex grace_mu = TKO__MUTEX_INITIALIZER(TKO__RANK_TIMER_GRACE);

/* Seams (seam.h; tests/unit/test_timer_cancel.c): a cancel that found its
 * timer armed, before it counts itself (counted false) and once counted
 * and still armed, before it takes timer_mu (true); a destroy waiting for
 * the cancels in flight. */
#ifdef TKO_TEST_SEAMS
void (*_Atomic tko__test_timer_cancel_window)(bool counted);
void (*_Atomic tko__test_timer_grace_window)(void);
#endif
typedef void (*cancel_seam)(bool counted);

static tko__timer *as_timer(tko_timer *t) { return (tko__timer *)(void *)t; }

static void place(tko_pool *pool, uint32_t pos, tko__timer *t) {
  pool->timers[pos] = t;
  t->heap_pos = pos;
}

/* The deadline heap (heap.h): earliest first. */
static bool due_before(const tko_pool *pool, const tko__timer *a, const tko__timer *b) {
  (void)pool;
  return a->deadline_ns < b->deadline_ns;
}
#define TIMER_AT(pool, pos) ((pool)->timers[pos])
#define TIMERS_LEN(pool) ((pool)->timers_len)
TKO__HEAP_DEFINE(timers, tko_pool, tko__timer *, TIMER_AT, place, due_before, TIMERS_LEN)

static void heap_remove(tko_pool *pool, tko__timer *t) { timers_remove_at(pool, t->heap_pos); }

/* A timer's task that never reached the queue ends in on_cancel: it was
 * accepted (the arm returned 0), so it counts as submitted and cancelled,
 * with an id of its own. For the hook's duration the thread counts as the
 * pool's (waiting on the pool from there would wait on itself). */
static void hand_to_cancel(tko_pool *pool, tko_task_fn fn, void *arg, int weight) {
  const tko_hooks *h = &pool->opts.hooks;
  tko_task_info info = {.id = tko__side_task(pool), .fn = fn, .arg = arg, .weight = weight,
                        .worker = UINT32_MAX};
  if (h->on_cancel) {
    tko_pool *prev = tko__enter_pool(pool);
    tko__witness_assert_none_held();
    h->on_cancel(h->user, &info);
    tko__leave_pool(prev);
  }
  /* seq_cst: wait_idle reads cancelled with finished, before submitted;
   * and before notify_idle's load of idle_waiters. A waiter that read the
   * side task's submit but not yet this cancel must be woken. */
  tko__add_seq(&pool->cancelled, 1);
  tko__notify_idle(pool);
}

/* Caller holds timer_mu. */
static void release_record(tko_pool *pool, tko__firing *rec) {
  rec->next_free = pool->timer_free;
  pool->timer_free = rec;
}

/* Takes an armed timer out of the heap, as state; caller holds timer_mu.
 * A periodic timer lets go of its record, which lives on while a firing is
 * out (that firing's end gives it back). */
static void disarm(tko_pool *pool, tko__timer *t, int state) {
  heap_remove(pool, t);
  tko__firing *rec = t->rec;
  t->rec = NULL;
  if (rec) {
    rec->timer = NULL;
    if (!rec->outstanding) release_record(pool, rec);
  }
  /* Seq_cst: the release pairs with tko_timer_cancel's loads, and the
   * store is the shutdown's half of the Dekker pair with a cancel's count
   * (see the essay). */
  tko__store_seq(&t->state, state);
}

static void firing_done(const tko__item *item, bool cancelled) {
  tko__firing *rec = (tko__firing *)(item->ctx & ~TKO__CTX_TAGS);
  tko_pool *pool = rec->pool;
  tko__mutex_lock(&pool->timer_mu);
  rec->outstanding = false;
  /* Cancelled (by shutdown): the argument has just reached on_cancel, so
   * the timer ends with it; nothing of it may run any more. */
  if (!rec->timer) release_record(pool, rec); /* disarmed meanwhile */
  else if (cancelled) disarm(pool, rec->timer, TIMER_CANCELLED); /* releases rec */
  tko__mutex_unlock(&pool->timer_mu);
}

static void firing_ran(const tko__item *item, int status) {
  (void)status;
  firing_done(item, false);
}
static void firing_cancelled(const tko__item *item) { firing_done(item, true); }

/* A firing is always started; the engine reports its end. */
static const tko__task_kind firing_kind = {.done = firing_ran, .cancelled = firing_cancelled};

/* Runs a due task on this thread (the timer thread, once the pool is
 * closed): a task that never reached the queue, so its id is a side task's
 * (top bit set; counted as submitted, seq_cst, before it can finish), and
 * stats count it among the tasks run off the workers. */
static void run_here(tko_pool *pool, const tko__item *due) {
  tko__item item = *due;
  item.id = tko__side_task(pool);
  tko__add_relaxed(&pool->off_worker_runs, 1); /* relaxed: a statistic only */
  tko_pool *prev = tko__enter_pool(pool);
  tko__run_item(pool, &pool->caller, &item);
  tko__leave_pool(prev);
  tko__notify_idle(pool);
}

/* Submits a due timer's task; what a refusal means is in the essay. */
static void fire(tko_pool *pool, const tko__item *item) {
  int rc = tko__submit_item(pool, item->fn, item->arg, item->ctx, item->weight, -1);
  if (rc == 0) return;
  if (rc == -ESHUTDOWN) {
    run_here(pool, item); /* closed: the timers close last, see the essay */
  } else if (item->ctx) {
    firing_done(item, false); /* periodic: skips this period */
  } else {
    hand_to_cancel(pool, item->fn, item->arg, item->weight); /* one-shot: already disarmed */
  }
}

static void *timer_main(void *arg) {
  tko_pool *pool = arg;
  char name[32];
  snprintf(name, sizeof name, "%s-t", pool->name);
  tko__thread_set_name(name);
  tko__mutex_lock(&pool->timer_mu);
  while (!pool->timer_stop) {
    if (pool->timers_len == 0) {
      tko__cond_wait(&pool->timer_cv, &pool->timer_mu);
      continue;
    }
    tko__timer *t = pool->timers[0];
    uint64_t now = tko__now_ns();
    if (t->deadline_ns > now) {
      struct timespec ts = {.tv_sec = (time_t)(t->deadline_ns / 1000000000u),
                            .tv_nsec = (long)(t->deadline_ns % 1000000000u)};
      tko__cond_timedwait(&pool->timer_cv, &pool->timer_mu, &ts);
      continue;
    }
    tko__item item = {.fn = t->fn, .arg = t->arg, .weight = t->weight};
    if (t->rec) {
      /* Whole periods from the first deadline; skip the ones already missed. */
      uint64_t late = now - t->deadline_ns;
      t->deadline_ns += (late / t->period_ns + 1) * t->period_ns;
      timers_sift_down(pool, 0);
      if (t->rec->outstanding) continue; /* one firing at a time */
      t->rec->outstanding = true;
      item.ctx = (uintptr_t)t->rec | TKO__CTX_KIND;
    } else {
      heap_remove(pool, t);
      /* Release: pairs with tko_timer_cancel's acquire load of state: a
       * caller that sees the timer fired sees the pool done with it. */
      atomic_store_explicit(&t->state, TIMER_FIRED, memory_order_release);
    }
    tko__mutex_unlock(&pool->timer_mu);
    fire(pool, &item);
    tko__mutex_lock(&pool->timer_mu);
  }
  tko__mutex_unlock(&pool->timer_mu);
  return NULL;
}

/* Grows the heap, takes a record for a periodic timer and starts the
 * thread as needed; caller holds timer_mu. */
static int prepare(tko_pool *pool, bool periodic, tko__firing **rec) {
  if (pool->timers_len == pool->timers_cap) {
    uint32_t cap = pool->timers_cap ? pool->timers_cap * 2 : 16;
    tko__timer **h = tko__mem_realloc(pool->opts.allocator, pool->timers, cap * sizeof *h);
    if (!h) return -ENOMEM;
    pool->timers = h;
    pool->timers_cap = cap;
  }
  *rec = NULL;
  if (periodic && !pool->timer_free) {
    tko__firing *r = tko__mem_alloc(pool->opts.allocator, sizeof *r);
    if (!r) return -ENOMEM;
    release_record(pool, r);
  }
  if (!pool->timer_started) {
    if (tko__thread_create(&pool->timer_thread, timer_main, pool)) return -EAGAIN;
    pool->timer_started = true;
  }
  if (periodic) {
    *rec = pool->timer_free;
    pool->timer_free = (*rec)->next_free;
  }
  return 0;
}

static int arm(tko_pool *pool, tko_timer *timer, long delay_ms, long period_ms, tko_task_fn fn,
               void *arg, int weight) {
  /* The bound keeps delay and period in nanoseconds, and a deadline of now
   * plus either, far from wrapping around (a wrapped deadline fired at once). */
  if (!pool || !timer || !fn || delay_ms < 0 || period_ms < 0) return -EINVAL;
  if ((long long)delay_ms > TKO_MAX_TIMER_MS || (long long)period_ms > TKO_MAX_TIMER_MS)
    return -EINVAL;
  if (tko__pool_forked(pool)) return -ECHILD;
  /* Before timer_mu (gate_mu is a leaf too); refused once shutdown went
   * past the timers' phase. */
  int rc = tko__phase_add(pool, &timer_phase);
  if (rc) return rc;
  tko__timer *t = as_timer(timer);
  tko__firing *rec = NULL;
  tko__mutex_lock(&pool->timer_mu);
  if (pool->timer_stop) rc = -ESHUTDOWN;
  else if (t->state == TIMER_ARMED) rc = -EBUSY;
  else rc = prepare(pool, period_ms > 0, &rec);
  if (rc == 0) {
    *t = (tko__timer){.fn = fn, .arg = arg, .pool = pool, .weight = weight, .rec = rec,
                      .deadline_ns = tko__now_ns() + (uint64_t)delay_ms * 1000000u,
                      .period_ns = (uint64_t)period_ms * 1000000u, .state = TIMER_ARMED};
    if (rec) *rec = (tko__firing){.kind = &firing_kind, .timer = t, .pool = pool};
    place(pool, pool->timers_len++, t);
    timers_sift_up(pool, t->heap_pos);
    if (t->heap_pos == 0) pthread_cond_signal(&pool->timer_cv);
  }
  tko__mutex_unlock(&pool->timer_mu);
  return rc;
}

void tko_timer_init(tko_timer *timer) {
  if (timer) memset(timer, 0, sizeof *timer);
}

int tko_submit_after(tko_pool *pool, tko_timer *timer, long delay_ms, tko_task_fn fn, void *arg,
                     int weight) {
  return arm(pool, timer, delay_ms, 0, fn, arg, weight);
}

int tko_submit_every(tko_pool *pool, tko_timer *timer, long period_ms, tko_task_fn fn,
                     void *arg, int weight) {
  if (period_ms <= 0) return -EINVAL;
  return arm(pool, timer, period_ms, period_ms, fn, arg, weight);
}

/* Under timer_mu of a pool a destroy waits for: disarms t if armed. */
static int cancel_counted(tko_pool *pool, tko__timer *t) {
  cancel_seam seam = TKO__SEAM(tko__test_timer_cancel_window);
  if (seam) seam(true);
  if (tko__pool_forked(pool)) return -ECHILD;
  tko__mutex_lock(&pool->timer_mu);
  int rc = -ENOENT;
  if (t->state == TIMER_ARMED) {
    disarm(pool, t, TIMER_CANCELLED);
    rc = 0;
  }
  tko__mutex_unlock(&pool->timer_mu);
  return rc;
}

int tko_timer_cancel(tko_timer *timer) {
  if (!timer) return -EINVAL;
  tko__timer *t = as_timer(timer);
  tko_pool *pool = t->pool;
  /* Not armed: fired, cancelled (shutdown disarms every timer) or never
   * armed; its pool may be destroyed by now, so do not touch it. Acquire:
   * pairs with the stores made under timer_mu. */
  if (!pool || tko__load_acquire(&t->state) != TIMER_ARMED) return -ENOENT;
  /* Counted, then the state again: seq_cst both, the cancel's half of the
   * Dekker pair with disarm's store and the destroy's look (see the
   * essay). The generation read is a hint: a cancel counted in the old
   * one after a destroy looked comes after the disarm, and sees it. */
  cancel_seam seam = TKO__SEAM(tko__test_timer_cancel_window);
  if (seam) seam(false);
  unsigned gen = tko__load_relaxed(&cancel_gen) & 1;
  tko__add_seq(&cancels_in[gen], 1);
  int rc = -ENOENT;
  if (tko__load_seq(&t->state) == TIMER_ARMED) rc = cancel_counted(pool, t);
  /* Seq_cst (release for the destroy's load): every access to the pool
   * above happens before the destroy that sees the count drop. */
  tko__sub_seq(&cancels_in[gen], 1);
  return rc;
}

/* A destroy, its timers disarmed: waits for the cancels that may still
 * reach the pool (see the essay). */
static void wait_for_cancels(void) {
  tko__mutex_lock(&grace_mu);
  unsigned old = tko__add_seq(&cancel_gen, 1) & 1; /* seq_cst: the flip comes before the look */
  void (*seam)(void) = TKO__SEAM(tko__test_timer_grace_window);
  for (unsigned step = 0; tko__load_seq(&cancels_in[old]); step++) {
    if (seam && step == 0) seam();
    tko__wait_step(step, 32);
  }
  tko__mutex_unlock(&grace_mu);
}

/* The phase's close (shutdown, last): stops the timer thread, then
 * disarms every timer, each to on_cancel. */
static int timers_close(tko_pool *pool, const struct timespec *deadline) {
  (void)deadline; /* the join waits at most for one firing's task */
  tko__mutex_lock(&pool->timer_mu);
  pool->timer_stop = true;
  pthread_cond_broadcast(&pool->timer_cv);
  bool started = pool->timer_started;
  pool->timer_started = false;
  tko__mutex_unlock(&pool->timer_mu);
  /* First the thread, with the firing it may be in the middle of. Shutdown
   * calls this last - the queue is empty and the workers are gone - so after
   * the join no firing is out, and each on_cancel below comes after its
   * timer's last run. */
  if (started) pthread_join(pool->timer_thread, NULL);
  tko__mutex_lock(&pool->timer_mu);
  while (pool->timers_len > 0) {
    tko__timer *t = pool->timers[0];
    tko_task_fn fn = t->fn;
    void *arg = t->arg;
    int weight = t->weight;
    assert(!(t->rec && t->rec->outstanding) && "timers_close: called before the drain");
    disarm(pool, t, TIMER_CANCELLED);
    tko__mutex_unlock(&pool->timer_mu);
    hand_to_cancel(pool, fn, arg, weight);
    tko__mutex_lock(&pool->timer_mu);
  }
  tko__mutex_unlock(&pool->timer_mu);
  return 0;
}

/* The phase's fini (destroy): frees the heap and the records. */
static void timers_fini(tko_pool *pool) {
  wait_for_cancels(); /* before the pool's memory goes */
  /* Every record is back on the free list once the pool is shut down. */
  while (pool->timer_free) {
    tko__firing *r = pool->timer_free;
    pool->timer_free = r->next_free;
    tko__mem_free(pool->opts.allocator, r);
  }
  tko__mem_free(pool->opts.allocator, pool->timers);
  pool->timers = NULL;
}
