/* SPDX-License-Identifier: MIT */
/* Delayed and periodic tasks: one min-heap of caller-owned timers per pool,
 * ordered by deadline, and one timer thread that sleeps until the earliest
 * deadline and submits what is due.
 *
 * Ownership: the pool touches a timer only under timer_mu while it is armed.
 * When one fires (or is cancelled) its fields are copied under the mutex and
 * its state changes before the mutex is released, so a caller may reuse or
 * free the storage as soon as it fires or tko_timer_cancel returns. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "mem.h"

enum { TIMER_IDLE = 0, TIMER_ARMED, TIMER_FIRED, TIMER_CANCELLED };

typedef struct tko__timer {
  tko_task_fn fn;
  void *arg;
  tko_pool *pool;
  uint64_t deadline_ns, period_ns; /* period 0 = one-shot */
  uint32_t heap_pos;
  int weight;
  /* Written under pool->timer_mu; atomic so that tko_timer_cancel can see
   * "not armed" without touching a pool that may be gone. */
  atomic_int state;
} tko__timer;

_Static_assert(sizeof(tko__timer) <= sizeof(tko_timer), "tko_timer too small");
_Static_assert(_Alignof(tko__timer) <= _Alignof(tko_timer), "tko_timer misaligned");

static tko__timer *as_timer(tko_timer *t) { return (tko__timer *)(void *)t; }

static void place(tko_pool *pool, uint32_t pos, tko__timer *t) {
  pool->timers[pos] = t;
  t->heap_pos = pos;
}

static void sift_up(tko_pool *pool, uint32_t pos) {
  tko__timer *t = pool->timers[pos];
  while (pos > 0) {
    uint32_t parent = (pos - 1) / 2;
    if (pool->timers[parent]->deadline_ns <= t->deadline_ns) break;
    place(pool, pos, pool->timers[parent]);
    pos = parent;
  }
  place(pool, pos, t);
}

static void sift_down(tko_pool *pool, uint32_t pos) {
  tko__timer *t = pool->timers[pos];
  for (;;) {
    uint32_t c = 2 * pos + 1;
    if (c >= pool->timers_len) break;
    if (c + 1 < pool->timers_len &&
        pool->timers[c + 1]->deadline_ns < pool->timers[c]->deadline_ns)
      c++;
    if (pool->timers[c]->deadline_ns >= t->deadline_ns) break;
    place(pool, pos, pool->timers[c]);
    pos = c;
  }
  place(pool, pos, t);
}

static void heap_remove(tko_pool *pool, tko__timer *t) {
  uint32_t pos = t->heap_pos;
  tko__timer *last = pool->timers[--pool->timers_len];
  if (last == t) return;
  place(pool, pos, last);
  sift_down(pool, pos);
  sift_up(pool, last->heap_pos);
}

static void hand_to_cancel(tko_pool *pool, tko_task_fn fn, void *arg, int weight) {
  const tko_hooks *h = &pool->opts.hooks;
  if (!h->on_cancel) return;
  tko_task_info info = {.fn = fn, .arg = arg, .weight = weight, .worker = UINT32_MAX};
  h->on_cancel(h->user, &info);
}

static void *timer_main(void *arg) {
  tko_pool *pool = arg;
  char name[32];
  snprintf(name, sizeof name, "%s-t", pool->name);
  tko__thread_set_name(name);
  pthread_mutex_lock(&pool->timer_mu);
  while (!pool->timer_stop) {
    if (pool->timers_len == 0) {
      pthread_cond_wait(&pool->timer_cv, &pool->timer_mu);
      continue;
    }
    tko__timer *t = pool->timers[0];
    uint64_t now = tko__now_ns();
    if (t->deadline_ns > now) {
      struct timespec ts = {.tv_sec = (time_t)(t->deadline_ns / 1000000000u),
                            .tv_nsec = (long)(t->deadline_ns % 1000000000u)};
      pthread_cond_timedwait(&pool->timer_cv, &pool->timer_mu, &ts);
      continue;
    }
    tko_task_fn fn = t->fn;
    void *targ = t->arg;
    int weight = t->weight;
    if (t->period_ns) {
      /* Whole periods from the first deadline; skip the ones already missed. */
      uint64_t late = now - t->deadline_ns;
      t->deadline_ns += (late / t->period_ns + 1) * t->period_ns;
      sift_down(pool, 0);
    } else {
      heap_remove(pool, t);
      atomic_store_explicit(&t->state, TIMER_FIRED, memory_order_release);
    }
    pthread_mutex_unlock(&pool->timer_mu);
    if (tko__submit_item(pool, fn, targ, 0, weight, -1)) hand_to_cancel(pool, fn, targ, weight);
    pthread_mutex_lock(&pool->timer_mu);
  }
  pthread_mutex_unlock(&pool->timer_mu);
  return NULL;
}

/* Grows the heap and starts the thread as needed; caller holds timer_mu. */
static int prepare(tko_pool *pool) {
  if (pool->timers_len == pool->timers_cap) {
    uint32_t cap = pool->timers_cap ? pool->timers_cap * 2 : 16;
    tko__timer **h = tko__mem_realloc(pool->opts.allocator, pool->timers, cap * sizeof *h);
    if (!h) return -ENOMEM;
    pool->timers = h;
    pool->timers_cap = cap;
  }
  if (!pool->timer_started) {
    if (tko__thread_create(&pool->timer_thread, timer_main, pool)) return -EAGAIN;
    pool->timer_started = true;
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
  tko__timer *t = as_timer(timer);
  int rc = 0;
  pthread_mutex_lock(&pool->timer_mu);
  if (pool->timer_stop) rc = -ESHUTDOWN;
  else if (t->state == TIMER_ARMED) rc = -EBUSY;
  else rc = prepare(pool);
  if (rc == 0) {
    *t = (tko__timer){.fn = fn, .arg = arg, .pool = pool, .weight = weight,
                      .deadline_ns = tko__now_ns() + (uint64_t)delay_ms * 1000000u,
                      .period_ns = (uint64_t)period_ms * 1000000u, .state = TIMER_ARMED};
    place(pool, pool->timers_len++, t);
    sift_up(pool, t->heap_pos);
    if (t->heap_pos == 0) pthread_cond_signal(&pool->timer_cv);
  }
  pthread_mutex_unlock(&pool->timer_mu);
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

int tko_timer_cancel(tko_timer *timer) {
  if (!timer) return -EINVAL;
  tko__timer *t = as_timer(timer);
  tko_pool *pool = t->pool;
  /* Not armed: fired, cancelled (shutdown disarms every timer) or never
   * armed; its pool may be destroyed by now, so do not touch it. Acquire:
   * pairs with the release stores made under timer_mu. */
  if (!pool || atomic_load_explicit(&t->state, memory_order_acquire) != TIMER_ARMED) return -ENOENT;
  if (tko__pool_forked(pool)) return -ECHILD;
  pthread_mutex_lock(&pool->timer_mu);
  int rc = -ENOENT;
  if (t->state == TIMER_ARMED) {
    heap_remove(pool, t);
    atomic_store_explicit(&t->state, TIMER_CANCELLED, memory_order_release);
    rc = 0;
  }
  pthread_mutex_unlock(&pool->timer_mu);
  return rc;
}

void tko__timers_close(tko_pool *pool) {
  pthread_mutex_lock(&pool->timer_mu);
  pool->timer_stop = true;
  while (pool->timers_len > 0) {
    tko__timer *t = pool->timers[0];
    tko_task_fn fn = t->fn;
    void *arg = t->arg;
    int weight = t->weight;
    heap_remove(pool, t);
    atomic_store_explicit(&t->state, TIMER_CANCELLED, memory_order_release);
    pthread_mutex_unlock(&pool->timer_mu);
    hand_to_cancel(pool, fn, arg, weight);
    pthread_mutex_lock(&pool->timer_mu);
  }
  pthread_cond_broadcast(&pool->timer_cv);
  bool started = pool->timer_started;
  pool->timer_started = false;
  pthread_mutex_unlock(&pool->timer_mu);
  if (started) pthread_join(pool->timer_thread, NULL);
}
