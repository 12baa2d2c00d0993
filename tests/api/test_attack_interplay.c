/* SPDX-License-Identifier: MIT */
/* Attack scenes where features meet, through the public headers only:
 * timers, async tasks, handles, groups and keyed tasks against shutdown in
 * every mode (timed, concurrent, destroy right after), cancels racing
 * shutdown, timers that fire during shutdown and complete async tasks, async
 * completions from hooks and on_cancel, helping waits across pools and on
 * elastic-only pools, fork, and extreme values. Every accepted task is
 * counted per task with atomics (ran, on_cancel) and must end exactly once;
 * every return code must be one the headers allow; a watchdog turns a hang
 * into an abort with the scene's name. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <taskorch.h>

#include "tko_test.h"
#include "tko_test_sync.h"

/* ---- watchdog ----------------------------------------------------------- */

typedef struct watchdog {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  const char *what;
} watchdog;

static void *wd_main(void *arg) {
  watchdog *w = arg;
  struct timespec dl;
  tt_deadline(&dl, TT_LONG_MS);
  pthread_mutex_lock(&w->mu);
  while (!w->done)
    if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) == ETIMEDOUT) break;
  bool done = w->done;
  pthread_mutex_unlock(&w->mu);
  if (!done) {
    fprintf(stderr, "WATCHDOG: scene '%s' still running after %ld ms: hang (pid %d)\n", w->what,
            TT_LONG_MS, (int)getpid());
    if (getenv("TKO_WD_HANG"))
      for (;;) pause(); /* leave it for gdb -p */
    abort();
  }
  return NULL;
}

static void wd_start(watchdog *w, const char *what) {
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->done = false;
  w->what = what;
  cr_assert_eq(pthread_create(&w->th, NULL, wd_main, w), 0);
}

static void wd_stop(watchdog *w) {
  pthread_mutex_lock(&w->mu);
  w->done = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->th, NULL);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
}

/* ---- per-task records ------------------------------------------------- */

enum { K_PLAIN = 1, K_ASYNC, K_ONESHOT, K_PERIODIC, K_CHAIN, K_KEYED, K_COMPLETER };

struct item;
typedef void (*item_cb)(struct item *it);

typedef struct item {
  int kind;
  int idx;
  atomic_int ran;       /* times its fn started (timer firings for periodic) */
  atomic_int oc;        /* times it reached on_cancel */
  atomic_int after_oc;  /* runs that began after its on_cancel */
  atomic_int inflight;  /* periodic: firings running now */
  atomic_int overlap;   /* periodic: a firing started while another ran */
  atomic_int cancel_rc; /* 1 = no cancel called */
  atomic_int arm_rc;    /* 1 = not armed */
  _Atomic uint64_t oc_id; /* the id on_cancel saw last */
  tko_async *_Atomic op;
  atomic_int completes;     /* tko_async_complete calls that returned 0 */
  atomic_int complete_bad;  /* complete calls that returned something else */
  struct item *target;      /* an async item this one completes */
  item_cb on_cancel_cb;     /* called from the pool's on_cancel */
  tko_timer timer;
  tko_handle handle;
} item;

static void item_init(item *it, int kind, int idx) {
  memset(it, 0, sizeof *it);
  it->kind = kind;
  it->idx = idx;
  atomic_store(&it->cancel_rc, 1);
  atomic_store(&it->arm_rc, 1);
  tko_timer_init(&it->timer);
}

static void complete_target(item *t) {
  tko_async *op = atomic_exchange(&t->op, NULL);
  if (!op) return;
  int rc = tko_async_complete(op, 0);
  if (rc == 0) atomic_fetch_add(&t->completes, 1);
  else atomic_fetch_add(&t->complete_bad, 1);
}

static void oc_hook(void *user, const tko_task_info *t) {
  (void)user;
  item *it = t->arg;
  if (!it) return;
  atomic_store(&it->oc_id, t->id);
  atomic_fetch_add(&it->oc, 1);
  if (it->on_cancel_cb) it->on_cancel_cb(it);
}

static int plain_fn(void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  return 0;
}

static int timer_fn(void *arg) {
  item *it = arg;
  if (atomic_load(&it->oc)) atomic_fetch_add(&it->after_oc, 1);
  if (atomic_fetch_add(&it->inflight, 1) != 0) atomic_fetch_add(&it->overlap, 1);
  atomic_fetch_add(&it->ran, 1);
  if (it->target) complete_target(it->target);
  atomic_fetch_sub(&it->inflight, 1);
  return 0;
}

static tko_pool *make_pool_hooks(unsigned workers, unsigned elastic, unsigned max_async) {
  tko_options o = tko_elastic_options(workers, elastic, elastic ? 1 : 0);
  o.hooks.on_cancel = oc_hook;
  o.max_async_inflight = max_async;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  return p;
}

static void assert_quiet_stats(tko_pool *p) {
  tko_stats st;
  tko_pool_stats(p, &st);
  if (st.submitted != st.completed + st.cancelled + st.queued + st.running || st.queued ||
      st.running || st.async_inflight)
    fprintf(stderr,
            "stats: submitted %llu completed %llu cancelled %llu queued %llu running %llu "
            "async_inflight %u\n",
            (unsigned long long)st.submitted, (unsigned long long)st.completed,
            (unsigned long long)st.cancelled, (unsigned long long)st.queued,
            (unsigned long long)st.running, st.async_inflight);
  cr_assert_eq(st.queued, 0);
  cr_assert_eq(st.running, 0);
  cr_assert_eq(st.async_inflight, 0);
  cr_assert_eq(st.submitted, st.completed + st.cancelled);
}

/* Shuts down in `mode` the way a host would: NOWAIT returns at once, then a
 * DRAIN call finishes the job (a later call continues). */
static void shut(tko_pool *p, tko_shutdown_mode mode) {
  if (mode == TKO_CANCEL_NOWAIT) {
    int rc = tko_pool_shutdown_timed(p, TKO_CANCEL_NOWAIT, -1);
    cr_assert_eq(rc, 0);
    cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  } else {
    cr_assert_eq(tko_pool_shutdown(p, mode), 0);
  }
}

/* ======================================================================
 * 1. Timer cancels racing firings and every shutdown mode: a successful
 * cancel means never (no run, no on_cancel); otherwise a one-shot runs or
 * reaches on_cancel exactly once; a periodic timer not cancelled reaches
 * on_cancel exactly once, after its last run, and never overlaps itself.
 * ==================================================================== */

#define T1_ONESHOT 48
#define T1_PERIODIC 8

typedef struct t1_ctx {
  item *items;
  int n;
  tt_gate go;
  atomic_int phase; /* 1: shutdown returned, 2: destroy returned */
} t1_ctx;

static void *t1_canceller(void *arg) {
  t1_ctx *c = arg;
  tt_gate_wait(&c->go);
  for (int i = 0; i < c->n; i += 2) {
    int before = atomic_load(&c->phase);
    int rc = tko_timer_cancel(&c->items[i].timer);
    atomic_store(&c->items[i].cancel_rc, rc);
    if (getenv("TKO_T1_TRACE"))
      fprintf(stderr, "t1 cancel %d (ran %d oc %d) phase %d->%d: %d\n", i,
              atomic_load(&c->items[i].ran), atomic_load(&c->items[i].oc), before,
              atomic_load(&c->phase), rc);
    if (i % 8 == 0) sched_yield();
  }
  return NULL;
}

static void t1_round(tko_shutdown_mode mode, unsigned workers) {
  static item items[T1_ONESHOT + T1_PERIODIC];
  tko_pool *p = make_pool_hooks(workers, 0, 0);
  for (int i = 0; i < T1_ONESHOT; i++) {
    item_init(&items[i], K_ONESHOT, i);
    cr_assert_eq(tko_submit_after(p, &items[i].timer, i % 4, timer_fn, &items[i], i % 3), 0);
  }
  for (int i = T1_ONESHOT; i < T1_ONESHOT + T1_PERIODIC; i++) {
    item_init(&items[i], K_PERIODIC, i);
    cr_assert_eq(tko_submit_every(p, &items[i].timer, 1 + i % 3, timer_fn, &items[i], i % 2), 0);
  }
  t1_ctx c = {items, T1_ONESHOT + T1_PERIODIC, TT_GATE_INIT, 0};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, t1_canceller, &c), 0);
  tt_gate_open(&c.go);
  shut(p, mode);
  atomic_store(&c.phase, 1);
  assert_quiet_stats(p);
  cr_assert_eq(tko_pool_destroy(p), 0);
  atomic_store(&c.phase, 2);
  pthread_join(th, NULL); /* the canceller may still run after the destroy: allowed */
  for (int i = 0; i < c.n; i++) {
    item *it = &items[i];
    int crc = atomic_load(&it->cancel_rc), ran = atomic_load(&it->ran), oc = atomic_load(&it->oc);
    if (crc != 1 && crc != 0 && crc != -ENOENT) {
      fprintf(stderr, "timer %d: cancel returned %d (%s)\n", i, crc, tko_err_name(crc));
      cr_assert(0);
    }
    cr_assert_eq(atomic_load(&it->after_oc), 0);
    cr_assert_eq(atomic_load(&it->overlap), 0);
    if (it->kind == K_ONESHOT) {
      if (crc == 0 && (ran || oc)) {
        fprintf(stderr, "one-shot %d: cancel 0 yet ran %d on_cancel %d\n", i, ran, oc);
        cr_assert(0);
      }
      if (crc != 0 && ran + oc != 1) {
        fprintf(stderr, "one-shot %d (mode %d, cancel %d): ran %d on_cancel %d\n", i, (int)mode,
                crc, ran, oc);
        cr_assert(0);
      }
      cr_assert_leq(ran, 1);
    } else {
      if (crc == 0) cr_assert_leq(oc, 1);
      else if (oc != 1) {
        fprintf(stderr, "periodic %d (mode %d, cancel %d): on_cancel %d, ran %d\n", i, (int)mode,
                crc, oc, ran);
        cr_assert(0);
      }
    }
    /* Shutdown disarmed everything: a cancel now finds nothing. */
    cr_assert_eq(tko_timer_cancel(&it->timer), -ENOENT);
  }
}

Test(attack_interplay, timer_cancels_racing_firings_and_a_drain_shutdown) {
  watchdog w;
  wd_start(&w, "timer_cancels_racing_firings_and_a_drain_shutdown");
  for (int r = 0; r < TT_SCALE(20, 4); r++) t1_round(TKO_DRAIN, 1 + r % 2);
  wd_stop(&w);
}

Test(attack_interplay, timer_cancels_racing_firings_and_a_cancel_shutdown) {
  watchdog w;
  wd_start(&w, "timer_cancels_racing_firings_and_a_cancel_shutdown");
  for (int r = 0; r < TT_SCALE(20, 4); r++) t1_round(TKO_CANCEL, 1 + r % 2);
  wd_stop(&w);
}

Test(attack_interplay, timer_cancels_racing_firings_and_a_nowait_shutdown) {
  watchdog w;
  wd_start(&w, "timer_cancels_racing_firings_and_a_nowait_shutdown");
  for (int r = 0; r < TT_SCALE(20, 4); r++) t1_round(TKO_CANCEL_NOWAIT, 1 + r % 2);
  wd_stop(&w);
}

/* ======================================================================
 * 2. A chain of timers, each armed by the previous one's task or by its
 * on_cancel, through a shutdown: every arming that was accepted ends in a run
 * or an on_cancel exactly once; every refusal is -ESHUTDOWN; the shutdown
 * returns.
 * ==================================================================== */

#define T2_CHAIN 3000

static struct {
  tko_pool *pool;
  item items[T2_CHAIN];
  atomic_int bad_rc;
  atomic_int last_armed;
} T2;

static void t2_arm_next(item *it) {
  int next = it->idx + 2; /* two chains: even and odd */
  if (next >= T2_CHAIN) return;
  item *n = &T2.items[next];
  int rc = tko_submit_after(T2.pool, &n->timer, 0, timer_fn, n, 0);
  atomic_store(&n->arm_rc, rc);
  if (rc == 0) {
    int prev = atomic_load(&T2.last_armed);
    while (prev < next && !atomic_compare_exchange_weak(&T2.last_armed, &prev, next)) {
    }
  } else if (rc != -ESHUTDOWN) {
    atomic_fetch_add(&T2.bad_rc, 1);
    fprintf(stderr, "chain arm %d: %d (%s)\n", next, rc, tko_err_name(rc));
  }
}

static int t2_fn(void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  t2_arm_next(it);
  return 0;
}

static void t2_round(tko_shutdown_mode mode) {
  T2.pool = make_pool_hooks(2, 0, 0);
  atomic_store(&T2.bad_rc, 0);
  atomic_store(&T2.last_armed, 0);
  for (int i = 0; i < T2_CHAIN; i++) {
    item_init(&T2.items[i], K_CHAIN, i);
    T2.items[i].on_cancel_cb = t2_arm_next;
  }
  for (int i = 0; i < 2; i++) {
    int rc = tko_submit_after(T2.pool, &T2.items[i].timer, i, t2_fn, &T2.items[i], 0);
    cr_assert_eq(rc, 0);
    atomic_store(&T2.items[i].arm_rc, rc);
  }
  shut(T2.pool, mode);
  assert_quiet_stats(T2.pool);
  cr_assert_eq(tko_pool_destroy(T2.pool), 0);
  cr_assert_eq(atomic_load(&T2.bad_rc), 0);
  for (int i = 0; i < T2_CHAIN; i++) {
    item *it = &T2.items[i];
    int arm = atomic_load(&it->arm_rc), ran = atomic_load(&it->ran), oc = atomic_load(&it->oc);
    if (arm == 0 ? ran + oc != 1 : ran + oc != 0) {
      fprintf(stderr, "chain link %d (mode %d): arm %d ran %d on_cancel %d\n", i, (int)mode, arm,
              ran, oc);
      cr_assert(0);
    }
  }
}

Test(attack_interplay, timer_chains_rearmed_by_tasks_and_on_cancel_through_shutdown) {
  watchdog w;
  wd_start(&w, "timer_chains_rearmed_by_tasks_and_on_cancel_through_shutdown");
  int longest = 0;
  for (int r = 0; r < TT_SCALE(12, 3); r++) {
    t2_round((tko_shutdown_mode)(r % 3));
    if (atomic_load(&T2.last_armed) > longest) longest = atomic_load(&T2.last_armed);
  }
  if (longest >= T2_CHAIN - 2)
    fprintf(stderr, "note: a shutdown let a self-re-arming timer chain run to its end (%d)\n",
            longest);
  wd_stop(&w);
}

/* ======================================================================
 * 3. An async task in flight when the shutdown's waiting part is cut short
 * (NOWAIT, or a timed call that times out): a timer armed afterwards is
 * accepted and its task completes the async task; the rest of the shutdown
 * and the destroy then return.
 * ==================================================================== */

static struct {
  item async_item;
  tt_count started;
} T3;

static int t3_async_start(tko_async *op, void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  atomic_store(&it->op, op);
  tt_count_add(&T3.started, 1);
  return 0;
}

static int t3_timer_fn(void *arg) {
  item *t = arg;
  atomic_fetch_add(&t->ran, 1);
  tko_async *op = atomic_exchange(&t->target->op, NULL);
  if (!op) return 1;
  int rc = tko_async_complete(op, 0);
  if (rc == 0) atomic_fetch_add(&t->target->completes, 1);
  else atomic_fetch_add(&t->target->complete_bad, 1);
  /* A second completion of the same op: -EALREADY. */
  int rc2 = tko_async_complete(op, 0);
  if (rc2 != -EALREADY) {
    fprintf(stderr, "second tko_async_complete: %d (%s)\n", rc2, tko_err_name(rc2));
    atomic_fetch_add(&t->target->complete_bad, 1);
  }
  return 0;
}

enum { T3_NOWAIT, T3_TIMED_DRAIN, T3_TIMED_CANCEL };

static void t3_round(int variant, long delay) {
  tko_pool *p = make_pool_hooks(1, 0, 0);
  item timer_it;
  item_init(&T3.async_item, K_ASYNC, 0);
  item_init(&timer_it, K_ONESHOT, 1);
  timer_it.target = &T3.async_item;
  tt_count_init(&T3.started);
  cr_assert_eq(tko_submit_async(p, t3_async_start, &T3.async_item, 0), 0);
  cr_assert(tt_count_wait_geq(&T3.started, 1));
  int rc;
  switch (variant) {
  case T3_NOWAIT:
    rc = tko_pool_shutdown_timed(p, TKO_CANCEL_NOWAIT, 0);
    cr_assert_eq(rc, 0);
    break;
  case T3_TIMED_DRAIN:
    rc = tko_pool_shutdown_timed(p, TKO_DRAIN, 0);
    cr_assert_eq(rc, -ETIMEDOUT);
    break;
  default:
    rc = tko_pool_shutdown_timed(p, TKO_CANCEL, 1);
    cr_assert_eq(rc, -ETIMEDOUT);
    break;
  }
  cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), -ESHUTDOWN);
  rc = tko_submit_after(p, &timer_it.timer, delay, t3_timer_fn, &timer_it, 0);
  if (rc != 0) {
    fprintf(stderr, "variant %d: tko_submit_after with an async task in flight: %d (%s)\n",
            variant, rc, tko_err_name(rc));
    complete_target(&T3.async_item);
    cr_assert_eq(rc, 0);
  }
  if (variant == T3_TIMED_DRAIN) cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  else cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_geq(st.caller_runs, 1); /* the timer's task ran on the timer thread */
  assert_quiet_stats(p);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&timer_it.ran), 1);
  cr_assert_eq(atomic_load(&timer_it.oc), 0);
  cr_assert_eq(atomic_load(&T3.async_item.ran), 1);
  cr_assert_eq(atomic_load(&T3.async_item.completes), 1);
  cr_assert_eq(atomic_load(&T3.async_item.complete_bad), 0);
  cr_assert_eq(atomic_load(&T3.async_item.oc), 0);
  tt_count_fini(&T3.started);
}

Test(attack_interplay, a_timer_armed_after_a_cut_short_shutdown_completes_the_async_task) {
  watchdog w;
  wd_start(&w, "a_timer_armed_after_a_cut_short_shutdown_completes_the_async_task");
  for (int r = 0; r < TT_SCALE(10, 3); r++)
    for (int v = 0; v < 3; v++) t3_round(v, r % 3);
  wd_stop(&w);
}

/* ======================================================================
 * 4. A CANCEL shutdown's on_cancel completes the async task it waits for;
 * a paused pool's queued handle, group member, keyed task and async task
 * all reach on_cancel once, with the statuses the headers give.
 * ==================================================================== */

static struct {
  item inflight, plain, member, handled, keyed, queued_async;
  tt_count started;
} T4;

static int t4_async_start(tko_async *op, void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  atomic_store(&it->op, op);
  tt_count_add(&T4.started, 1);
  return 0;
}

static void t4_complete_inflight(item *it) {
  (void)it;
  complete_target(&T4.inflight);
}

static void t4_round(unsigned workers, tko_shutdown_mode mode) {
  tko_pool *p = make_pool_hooks(workers, 0, 0);
  item_init(&T4.inflight, K_ASYNC, 0);
  item_init(&T4.plain, K_PLAIN, 1);
  item_init(&T4.member, K_PLAIN, 2);
  item_init(&T4.handled, K_PLAIN, 3);
  item_init(&T4.keyed, K_KEYED, 4);
  item_init(&T4.queued_async, K_ASYNC, 5);
  T4.plain.on_cancel_cb = t4_complete_inflight;
  /* Nothing submitted after the pause may start before the shutdown: if the
   * queued async task started anyway, the watchdog reports the hang. */
  tt_count_init(&T4.started);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_submit_async(p, t4_async_start, &T4.inflight, 5), 0);
  cr_assert(tt_count_wait_geq(&T4.started, 1));
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, plain_fn, &T4.plain, INT_MIN), 0);
  cr_assert_eq(tko_group_submit(p, &g, plain_fn, &T4.member, INT_MAX), 0);
  cr_assert_eq(tko_submit_handle(p, &T4.handled.handle, plain_fn, &T4.handled, 0), 0);
  cr_assert_eq(tko_submit_keyed(p, UINT64_MAX, plain_fn, &T4.keyed, -1), 0);
  cr_assert_eq(tko_submit_async(p, t4_async_start, &T4.queued_async, 1), 0);
  shut(p, mode);
  assert_quiet_stats(p);
  /* Everything queued was paused: a worker may have taken some just before
   * the pause (the header allows it), so each ends exactly once either way. */
  item *all[] = {&T4.plain, &T4.member, &T4.handled, &T4.keyed, &T4.queued_async};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    int ran = atomic_load(&all[i]->ran), oc = atomic_load(&all[i]->oc);
    if (ran + oc != 1) {
      fprintf(stderr, "item %d: ran %d on_cancel %d\n", all[i]->idx, ran, oc);
      cr_assert(0);
    }
  }
  int hs = tko_handle_status(&T4.handled.handle);
  cr_assert_eq(hs, atomic_load(&T4.handled.oc) ? -ECANCELED : 0);
  cr_assert_eq(tko_handle_wait(&T4.handled.handle, 0), 0);
  cr_assert_eq(tko_group_pending(&g), 0);
  cr_assert_eq(tko_group_status(&g), atomic_load(&T4.member.oc) ? -ECANCELED : 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&T4.inflight.completes), 1);
  cr_assert_eq(atomic_load(&T4.inflight.complete_bad), 0);
  cr_assert_eq(atomic_load(&T4.inflight.oc), 0);
  tt_count_fini(&T4.started);
}

Test(attack_interplay, on_cancel_completes_the_inflight_async_task_a_cancel_shutdown_waits_for) {
  watchdog w;
  wd_start(&w, "on_cancel_completes_the_inflight_async_task_a_cancel_shutdown_waits_for");
  for (int r = 0; r < TT_SCALE(30, 6); r++) {
    /* A DRAIN would start the plain task instead of cancelling it, and then
     * nothing completes the async task: only the cancel modes here. */
    t4_round(1 + r % 2, r % 2 ? TKO_CANCEL : TKO_CANCEL_NOWAIT);
  }
  wd_stop(&w);
}

/* ======================================================================
 * 5. Handle cancels and group cancels racing a CANCEL shutdown on a pool
 * whose worker is pinned: each task runs or reaches on_cancel exactly once,
 * and each return code agrees with what happened.
 * ==================================================================== */

#define T5_N 32

static struct {
  item h[T5_N], m[T5_N];
  tko_group g;
  tko_pool *pool;
  tt_gate go;
  atomic_long group_cancelled;
  atomic_int group_bad;
  int shut_rc;
} T5;

static void *t5_handles(void *arg) {
  (void)arg;
  tt_gate_wait(&T5.go);
  for (int i = T5_N - 1; i >= 0; i--) {
    int rc = tko_handle_cancel(&T5.h[i].handle);
    atomic_store(&T5.h[i].cancel_rc, rc);
  }
  return NULL;
}

static void *t5_group(void *arg) {
  (void)arg;
  tt_gate_wait(&T5.go);
  for (int k = 0; k < 3; k++) {
    long n = tko_group_cancel(&T5.g);
    if (n < 0) atomic_fetch_add(&T5.group_bad, 1);
    else atomic_fetch_add(&T5.group_cancelled, n);
    sched_yield();
  }
  return NULL;
}

static void *t5_shutdown(void *arg) {
  (void)arg;
  tt_gate_wait(&T5.go);
  T5.shut_rc = tko_pool_shutdown(T5.pool, TKO_CANCEL);
  return NULL;
}

static void t5_round(void) {
  T5.pool = make_pool_hooks(1, 0, 0);
  tt_pin pin = TT_PIN_INIT;
  tt_gate go = TT_GATE_INIT;
  T5.go = go;
  atomic_store(&T5.group_cancelled, 0);
  atomic_store(&T5.group_bad, 0);
  cr_assert_eq(tko_group_init(&T5.g), 0);
  cr_assert_eq(tko_submit(T5.pool, tt_pin_fn, &pin, INT_MAX), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  for (int i = 0; i < T5_N; i++) {
    item_init(&T5.h[i], K_PLAIN, i);
    item_init(&T5.m[i], K_PLAIN, T5_N + i);
    cr_assert_eq(tko_submit_handle(T5.pool, &T5.h[i].handle, plain_fn, &T5.h[i], i), 0);
    cr_assert_eq(tko_group_submit(T5.pool, &T5.g, plain_fn, &T5.m[i], i), 0);
  }
  pthread_t a, b, s;
  cr_assert_eq(pthread_create(&a, NULL, t5_handles, NULL), 0);
  cr_assert_eq(pthread_create(&b, NULL, t5_group, NULL), 0);
  cr_assert_eq(pthread_create(&s, NULL, t5_shutdown, NULL), 0);
  tt_gate_open(&T5.go);
  /* Let the pinned worker go at some point in the race. */
  tt_gate_open(&pin.gate);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  pthread_join(s, NULL);
  cr_assert_eq(T5.shut_rc, 0);
  assert_quiet_stats(T5.pool);
  tko_stats st;
  tko_pool_stats(T5.pool, &st);
  long oc_total = 0;
  for (int i = 0; i < T5_N; i++) {
    item *h = &T5.h[i], *m = &T5.m[i];
    int crc = atomic_load(&h->cancel_rc), ran = atomic_load(&h->ran), oc = atomic_load(&h->oc);
    if (ran + oc != 1 || atomic_load(&m->ran) + atomic_load(&m->oc) != 1) {
      fprintf(stderr, "task %d: handle ran %d oc %d; member ran %d oc %d\n", i, ran, oc,
              atomic_load(&m->ran), atomic_load(&m->oc));
      cr_assert(0);
    }
    oc_total += oc + atomic_load(&m->oc);
    bool ok = (crc == 0 && oc == 1) || (crc == -EBUSY && ran == 1) ||
              (crc == -EALREADY && oc == 1);
    if (!ok) {
      fprintf(stderr, "handle %d: cancel %d (%s) but ran %d on_cancel %d\n", i, crc,
              tko_err_name(crc), ran, oc);
      cr_assert(0);
    }
    int hs = tko_handle_status(&h->handle);
    cr_assert_eq(hs, oc ? -ECANCELED : 0);
  }
  cr_assert_eq(atomic_load(&T5.group_bad), 0);
  long mem_oc = 0;
  for (int i = 0; i < T5_N; i++) mem_oc += atomic_load(&T5.m[i].oc);
  cr_assert_leq(atomic_load(&T5.group_cancelled), mem_oc);
  cr_assert_eq((long)st.cancelled, oc_total);
  cr_assert_eq(tko_group_pending(&T5.g), 0);
  cr_assert_eq(tko_group_status(&T5.g), mem_oc ? -ECANCELED : 0);
  cr_assert_eq(tko_group_destroy(&T5.g), 0);
  cr_assert_eq(tko_pool_destroy(T5.pool), 0);
}

Test(attack_interplay, handle_and_group_cancels_racing_a_cancel_shutdown_are_exactly_once) {
  watchdog w;
  wd_start(&w, "handle_and_group_cancels_racing_a_cancel_shutdown_are_exactly_once");
  for (int r = 0; r < TT_SCALE(40, 8); r++) t5_round();
  wd_stop(&w);
}

/* ======================================================================
 * 6. Keyed tasks that wait on groups (helping waits): per key, one at a
 * time and in submit order, even though a helping worker runs other keys'
 * runners nested inside a keyed task.
 * ==================================================================== */

#define T6_KEYS 4
#define T6_PER_KEY 40

static struct {
  tko_pool *pool;
  atomic_int busy[T6_KEYS];
  atomic_int next[T6_KEYS];
  atomic_int violations;
  atomic_int members_ran;
  atomic_int wait_bad;
  tt_count done;
} T6;

typedef struct t6_arg {
  int key, seq;
} t6_arg;

static int t6_member(void *arg) {
  (void)arg;
  atomic_fetch_add(&T6.members_ran, 1);
  return 0;
}

static int t6_keyed(void *arg) {
  t6_arg *a = arg;
  if (atomic_exchange(&T6.busy[a->key], 1) != 0) atomic_fetch_add(&T6.violations, 1);
  if (atomic_load(&T6.next[a->key]) != a->seq) atomic_fetch_add(&T6.violations, 1);
  tko_group g;
  tko_group_init(&g);
  for (int i = 0; i < 3; i++)
    if (tko_group_submit(T6.pool, &g, t6_member, NULL, (i - 1) * 1000) != 0)
      atomic_fetch_add(&T6.wait_bad, 1);
  int rc = tko_group_wait(&g, -1);
  if (rc != 0) {
    atomic_fetch_add(&T6.wait_bad, 1);
    fprintf(stderr, "keyed %d/%d: group wait %d (%s)\n", a->key, a->seq, rc, tko_err_name(rc));
    while (tko_group_wait(&g, 0) != 0) sched_yield();
  }
  tko_group_destroy(&g);
  atomic_store(&T6.next[a->key], a->seq + 1);
  atomic_store(&T6.busy[a->key], 0);
  tt_count_add(&T6.done, 1);
  return 0;
}

typedef struct t6_sub {
  int key0;
  t6_arg *args;
} t6_sub;

static void *t6_submitter(void *arg) {
  t6_sub *s = arg;
  for (int seq = 0; seq < T6_PER_KEY; seq++)
    for (int k = s->key0; k < s->key0 + 2; k++) {
      t6_arg *a = &s->args[k * T6_PER_KEY + seq];
      a->key = k;
      a->seq = seq;
      int rc = tko_submit_keyed(T6.pool, (uint64_t)k * 0x9E3779B97F4A7C15ull, t6_keyed, a,
                                (seq % 3) * 100 - 100);
      if (rc != 0) {
        fprintf(stderr, "keyed submit: %d\n", rc);
        atomic_fetch_add(&T6.wait_bad, 1);
      }
    }
  return NULL;
}

Test(attack_interplay, keyed_tasks_that_help_in_group_waits_keep_key_order_and_exclusion) {
  watchdog w;
  wd_start(&w, "keyed_tasks_that_help_in_group_waits_keep_key_order_and_exclusion");
  static t6_arg args[T6_KEYS * T6_PER_KEY];
  for (int r = 0; r < TT_SCALE(6, 2); r++) {
    T6.pool = make_pool_hooks(1 + r % 2, r % 3 == 2 ? 2 : 0, 0);
    for (int k = 0; k < T6_KEYS; k++) {
      atomic_store(&T6.busy[k], 0);
      atomic_store(&T6.next[k], 0);
    }
    atomic_store(&T6.violations, 0);
    atomic_store(&T6.members_ran, 0);
    atomic_store(&T6.wait_bad, 0);
    tt_count_init(&T6.done);
    t6_sub s0 = {0, args}, s1 = {2, args};
    pthread_t a, b;
    cr_assert_eq(pthread_create(&a, NULL, t6_submitter, &s0), 0);
    cr_assert_eq(pthread_create(&b, NULL, t6_submitter, &s1), 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    cr_assert(tt_count_wait_geq(&T6.done, T6_KEYS * T6_PER_KEY));
    cr_assert_eq(tko_pool_wait_idle(T6.pool, TT_LONG_MS), 0);
    assert_quiet_stats(T6.pool);
    cr_assert_eq(tko_pool_destroy(T6.pool), 0);
    cr_assert_eq(atomic_load(&T6.violations), 0);
    cr_assert_eq(atomic_load(&T6.wait_bad), 0);
    cr_assert_eq(atomic_load(&T6.members_ran), 3 * T6_KEYS * T6_PER_KEY);
    for (int k = 0; k < T6_KEYS; k++) cr_assert_eq(atomic_load(&T6.next[k]), T6_PER_KEY);
    tt_count_fini(&T6.done);
  }
  wd_stop(&w);
}

/* ======================================================================
 * 7. One worker, max_async_inflight 1: a task waits (helping) on a group
 * whose async member arms a timer from its start; the timer's task completes
 * it. With a DRAIN shutdown racing from the test thread or not.
 * ==================================================================== */

static struct {
  tko_pool *pool;
  item member, timer_it, blocker;
  tko_group g;
  atomic_int wait_rc, arm_rc;
  tt_count started, finished;
} T7;

static int t7_member_start(tko_async *op, void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  atomic_store(&it->op, op);
  int rc = tko_submit_after(T7.pool, &T7.timer_it.timer, it->idx, timer_fn, &T7.timer_it, 0);
  atomic_store(&T7.arm_rc, rc);
  if (rc != 0) complete_target(it); /* keep the scene finite; the check catches it */
  return 0;
}

static int t7_blocker_start(tko_async *op, void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  /* Holds the one in-flight slot until the waiter's task completes it. */
  atomic_store(&it->op, op);
  return 0;
}

static int t7_waiter(void *arg) {
  (void)arg;
  int rc = tko_group_submit_async(T7.pool, &T7.g, t7_member_start, &T7.member, 0);
  /* Frees the in-flight slot the blocker holds, so the member can start. */
  complete_target(&T7.blocker);
  tt_count_add(&T7.started, 1);
  if (rc != 0) {
    atomic_store(&T7.wait_rc, -999);
    tt_count_add(&T7.finished, 1);
    return 1;
  }
  atomic_store(&T7.wait_rc, tko_group_wait(&T7.g, -1));
  tt_count_add(&T7.finished, 1);
  return 0;
}

static void t7_round(bool shutdown_races, long delay) {
  T7.pool = make_pool_hooks(1, 0, 1);
  item_init(&T7.member, K_ASYNC, (int)delay);
  item_init(&T7.timer_it, K_ONESHOT, 0);
  item_init(&T7.blocker, K_ASYNC, 0);
  T7.timer_it.target = &T7.member;
  atomic_store(&T7.wait_rc, 1);
  atomic_store(&T7.arm_rc, 1);
  tt_count_init(&T7.started);
  tt_count_init(&T7.finished);
  cr_assert_eq(tko_group_init(&T7.g), 0);
  cr_assert_eq(tko_submit_async(T7.pool, t7_blocker_start, &T7.blocker, 10), 0);
  cr_assert_eq(tko_submit(T7.pool, t7_waiter, NULL, 5), 0);
  cr_assert(tt_count_wait_geq(&T7.started, 1));
  if (shutdown_races) cr_assert_eq(tko_pool_shutdown(T7.pool, TKO_DRAIN), 0);
  cr_assert(tt_count_wait_geq(&T7.finished, 1));
  if (!shutdown_races) cr_assert_eq(tko_pool_wait_idle(T7.pool, TT_LONG_MS), 0);
  int wrc = atomic_load(&T7.wait_rc), arc = atomic_load(&T7.arm_rc);
  if (wrc != 0 || arc != 0) {
    fprintf(stderr, "shutdown_races %d delay %ld: wait %d, arm %d (%s)\n", shutdown_races, delay,
            wrc, arc, tko_err_name(arc));
    cr_assert(0);
  }
  cr_assert_eq(tko_group_status(&T7.g), 0);
  cr_assert_eq(tko_group_destroy(&T7.g), 0);
  if (!shutdown_races) cr_assert_eq(tko_pool_shutdown(T7.pool, TKO_CANCEL), 0);
  assert_quiet_stats(T7.pool);
  cr_assert_eq(tko_pool_destroy(T7.pool), 0);
  cr_assert_eq(atomic_load(&T7.member.completes), 1);
  cr_assert_eq(atomic_load(&T7.member.complete_bad), 0);
  cr_assert_eq(atomic_load(&T7.blocker.completes), 1);
  cr_assert_eq(atomic_load(&T7.timer_it.ran), 1);
  cr_assert_eq(atomic_load(&T7.timer_it.oc), 0);
  tt_count_fini(&T7.started);
  tt_count_fini(&T7.finished);
}

Test(attack_interplay, a_helping_wait_on_an_async_member_a_timer_completes_on_one_worker) {
  watchdog w;
  wd_start(&w, "a_helping_wait_on_an_async_member_a_timer_completes_on_one_worker");
  for (int r = 0; r < TT_SCALE(30, 6); r++) t7_round(r % 2, r % 3);
  wd_stop(&w);
}

/* ======================================================================
 * 8. Two pools shut down at once, one waiting for an async task that a task
 * of the other completes, that task run by a helping group wait of a task of
 * its own pool waiting on a group of the first.
 * ==================================================================== */

static struct {
  tko_pool *a, *b;
  item amember, completer;
  tko_group ga;
  atomic_int wait_rc, submit_rc;
  tt_count a_started, b_started;
  int shut_a, shut_b;
  tko_shutdown_mode mode_a, mode_b;
} T8;

static int t8_a_start(tko_async *op, void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  atomic_store(&it->op, op);
  tt_count_add(&T8.a_started, 1);
  return 0;
}

static int t8_completer(void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  complete_target(&T8.amember);
  return 0;
}

static void t8_completer_cancelled(item *it) {
  (void)it;
  complete_target(&T8.amember);
}

static int t8_b_waiter(void *arg) {
  (void)arg;
  tt_count_add(&T8.b_started, 1);
  /* Queued behind this task on this one-worker pool: only this wait's
   * helping can run it. */
  int rc = tko_submit(T8.b, t8_completer, &T8.completer, -5);
  atomic_store(&T8.submit_rc, rc);
  if (rc != 0) complete_target(&T8.amember); /* B's shutdown came first */
  atomic_store(&T8.wait_rc, tko_group_wait(&T8.ga, -1));
  return 0;
}

static void *t8_shut_a(void *arg) {
  (void)arg;
  T8.shut_a = tko_pool_shutdown(T8.a, T8.mode_a);
  return NULL;
}

static void *t8_shut_b(void *arg) {
  (void)arg;
  T8.shut_b = tko_pool_shutdown(T8.b, T8.mode_b);
  return NULL;
}

Test(attack_interplay, two_pools_shutting_down_complete_each_others_async_task_by_helping) {
  watchdog w;
  wd_start(&w, "two_pools_shutting_down_complete_each_others_async_task_by_helping");
  for (int r = 0; r < TT_SCALE(30, 6); r++) {
    T8.a = make_pool_hooks(1, 0, 0);
    T8.b = make_pool_hooks(1, 0, 0);
    T8.mode_a = r % 2 ? TKO_CANCEL : TKO_DRAIN;
    T8.mode_b = (r / 2) % 2 ? TKO_CANCEL : TKO_DRAIN;
    item_init(&T8.amember, K_ASYNC, 0);
    item_init(&T8.completer, K_PLAIN, 1);
    T8.completer.on_cancel_cb = t8_completer_cancelled; /* B's CANCEL may drop it */
    atomic_store(&T8.wait_rc, 1);
    tt_count_init(&T8.a_started);
    tt_count_init(&T8.b_started);
    cr_assert_eq(tko_group_init(&T8.ga), 0);
    cr_assert_eq(tko_group_submit_async(T8.a, &T8.ga, t8_a_start, &T8.amember, 0), 0);
    cr_assert(tt_count_wait_geq(&T8.a_started, 1));
    cr_assert_eq(tko_submit(T8.b, t8_b_waiter, NULL, 100), 0);
    cr_assert(tt_count_wait_geq(&T8.b_started, 1));
    pthread_t sa, sb;
    cr_assert_eq(pthread_create(&sa, NULL, t8_shut_a, NULL), 0);
    cr_assert_eq(pthread_create(&sb, NULL, t8_shut_b, NULL), 0);
    pthread_join(sa, NULL);
    pthread_join(sb, NULL);
    cr_assert_eq(T8.shut_a, 0);
    cr_assert_eq(T8.shut_b, 0);
    cr_assert_eq(atomic_load(&T8.wait_rc), 0);
    int src = atomic_load(&T8.submit_rc);
    cr_assert(src == 0 || src == -ESHUTDOWN);
    cr_assert_eq(atomic_load(&T8.completer.ran) + atomic_load(&T8.completer.oc), src == 0);
    cr_assert_eq(atomic_load(&T8.amember.completes), 1);
    cr_assert_eq(tko_group_status(&T8.ga), 0);
    cr_assert_eq(tko_group_destroy(&T8.ga), 0);
    assert_quiet_stats(T8.a);
    assert_quiet_stats(T8.b);
    cr_assert_eq(tko_pool_destroy(T8.a), 0);
    cr_assert_eq(tko_pool_destroy(T8.b), 0);
    tt_count_fini(&T8.a_started);
    tt_count_fini(&T8.b_started);
  }
  wd_stop(&w);
}

/* ======================================================================
 * 9. Async completions from hooks: before_run, after_run and on_failure of
 * other tasks complete in-flight async tasks; after_run of the async task
 * itself then runs on the completing thread (inside a hook). Each completes
 * exactly once; a second complete is -EALREADY.
 * ==================================================================== */

#define T9_N 24

static struct {
  item asyncs[T9_N];
  atomic_int next_to_complete;
  atomic_int started;
  atomic_int after_runs_async;
  atomic_int bad;
} T9;

static void t9_complete_one(void) {
  int i = atomic_fetch_add(&T9.next_to_complete, 1);
  if (i >= T9_N) return;
  item *it = &T9.asyncs[i];
  tko_async *op;
  /* Started before the plain tasks were submitted (see the test). */
  while ((op = atomic_exchange(&it->op, NULL)) == NULL) {
    if (atomic_load(&it->completes)) return;
    sched_yield();
  }
  int rc = tko_async_complete(op, i % 3 ? 0 : -EIO);
  if (rc == 0) atomic_fetch_add(&it->completes, 1);
  else atomic_fetch_add(&T9.bad, 1);
}

static int t9_async_start(tko_async *op, void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  atomic_store(&it->op, op);
  atomic_fetch_add(&T9.started, 1);
  return 0;
}

static void t9_before(void *user, const tko_task_info *t) {
  (void)user;
  if ((item *)t->arg >= T9.asyncs && (item *)t->arg < T9.asyncs + T9_N) return;
  if (t->fn == plain_fn && ((item *)t->arg)->idx % 3 == 0) t9_complete_one();
}

static void t9_after(void *user, const tko_task_info *t) {
  (void)user;
  if ((item *)t->arg >= T9.asyncs && (item *)t->arg < T9.asyncs + T9_N) {
    atomic_fetch_add(&T9.after_runs_async, 1);
    return;
  }
  if (t->fn == plain_fn && ((item *)t->arg)->idx % 3 == 1) t9_complete_one();
}

static int t9_failing(void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  return -EPIPE;
}

static void t9_on_failure(void *user, const tko_task_info *t) {
  (void)user;
  if (t->fn == t9_failing) t9_complete_one();
}

Test(attack_interplay, async_tasks_completed_from_other_tasks_hooks_complete_once) {
  watchdog w;
  wd_start(&w, "async_tasks_completed_from_other_tasks_hooks_complete_once");
  for (int r = 0; r < TT_SCALE(20, 5); r++) {
    tko_options o = tko_basic_options(2);
    o.hooks.before_run = t9_before;
    o.hooks.after_run = t9_after;
    o.hooks.on_failure = t9_on_failure;
    o.hooks.on_cancel = oc_hook;
    tko_pool *p;
    cr_assert_eq(tko_pool_create(&p, &o), 0);
    atomic_store(&T9.next_to_complete, 0);
    atomic_store(&T9.started, 0);
    atomic_store(&T9.after_runs_async, 0);
    atomic_store(&T9.bad, 0);
    for (int i = 0; i < T9_N; i++) {
      item_init(&T9.asyncs[i], K_ASYNC, i);
      cr_assert_eq(tko_submit_async(p, t9_async_start, &T9.asyncs[i], 0), 0);
    }
    static item plains[T9_N];
    for (int i = 0; i < T9_N; i++) {
      item_init(&plains[i], K_PLAIN, i);
      cr_assert_eq(tko_submit(p, i % 3 == 2 ? t9_failing : plain_fn, &plains[i], -1), 0);
    }
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    cr_assert_eq(tko_pool_shutdown(p, r % 2 ? TKO_CANCEL : TKO_DRAIN), 0);
    tko_stats st;
    tko_pool_stats(p, &st);
    assert_quiet_stats(p);
    cr_assert_eq(st.failed, (uint64_t)(T9_N / 3 + T9_N / 3)); /* EIO completions + EPIPE tasks */
    cr_assert_eq(tko_pool_destroy(p), 0);
    cr_assert_eq(atomic_load(&T9.bad), 0);
    cr_assert_eq(atomic_load(&T9.after_runs_async), T9_N);
    for (int i = 0; i < T9_N; i++) {
      cr_assert_eq(atomic_load(&T9.asyncs[i].completes), 1);
      cr_assert_eq(atomic_load(&plains[i].ran), 1);
    }
  }
  wd_stop(&w);
}

/* ======================================================================
 * 10. During a DRAIN held open by an in-flight async task, a timer's task
 * (on the timer thread) tries every kind of submit: the pool's own submits
 * are -ESHUTDOWN (a handle stays unarmed, a group gains no member), and a
 * timer it arms is accepted and completes the async task.
 * ==================================================================== */

static struct {
  tko_pool *pool;
  item async_it, t1, t2, probe;
  tko_group g;
  tko_handle h;
  int rc_submit, rc_keyed, rc_handle, rc_group, rc_async, rc_batch, rc_arm, rc_timed;
  uint64_t id_after;
  atomic_int t1_done;
  tt_count started;
} T10;

static int t10_async_start(tko_async *op, void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  atomic_store(&it->op, op);
  tt_count_add(&T10.started, 1);
  return 0;
}

static int t10_t1(void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  T10.rc_submit = tko_submit(T10.pool, plain_fn, &T10.probe, 0);
  T10.rc_keyed = tko_submit_keyed(T10.pool, 7, plain_fn, &T10.probe, 0);
  T10.rc_handle = tko_submit_handle(T10.pool, &T10.h, plain_fn, &T10.probe, 0);
  T10.rc_group = tko_group_submit(T10.pool, &T10.g, plain_fn, &T10.probe, 0);
  T10.rc_async = tko_submit_async(T10.pool, t10_async_start, &T10.probe, 0);
  tko_task t = {plain_fn, &T10.probe, 0};
  T10.rc_batch = tko_submit_batch(T10.pool, &t, 1);
  T10.rc_timed = tko_submit_timed(T10.pool, plain_fn, &T10.probe, 0, 0);
  T10.rc_arm = tko_submit_after(T10.pool, &T10.t2.timer, 0, timer_fn, &T10.t2, 0);
  atomic_store(&T10.t1_done, 1);
  return 0;
}

Test(attack_interplay, a_timer_task_during_a_drain_gets_eshutdown_from_every_submit_but_timers) {
  watchdog w;
  wd_start(&w, "a_timer_task_during_a_drain_gets_eshutdown_from_every_submit_but_timers");
  for (int r = 0; r < TT_SCALE(20, 5); r++) {
    T10.pool = make_pool_hooks(1 + r % 2, 0, 0);
    item_init(&T10.async_it, K_ASYNC, 0);
    item_init(&T10.t1, K_ONESHOT, 1);
    item_init(&T10.t2, K_ONESHOT, 2);
    item_init(&T10.probe, K_PLAIN, 3);
    T10.t2.target = &T10.async_it;
    atomic_store(&T10.t1_done, 0);
    memset(&T10.h, 0, sizeof T10.h);
    tt_count_init(&T10.started);
    cr_assert_eq(tko_group_init(&T10.g), 0);
    cr_assert_eq(tko_submit_async(T10.pool, t10_async_start, &T10.async_it, 0), 0);
    cr_assert(tt_count_wait_geq(&T10.started, 1));
    /* Past CLOSING once a plain submit is refused. */
    cr_assert_eq(tko_pool_shutdown_timed(T10.pool, r % 2 ? TKO_CANCEL : TKO_DRAIN, 0),
                 -ETIMEDOUT);
    cr_assert_eq(tko_submit(T10.pool, plain_fn, &T10.probe, 0), -ESHUTDOWN);
    cr_assert_eq(tko_submit_after(T10.pool, &T10.t1.timer, r % 3, t10_t1, &T10.t1, 0), 0);
    cr_assert_eq(tko_pool_shutdown(T10.pool, TKO_DRAIN), 0);
    cr_assert_eq(atomic_load(&T10.t1_done), 1);
    cr_assert_eq(T10.rc_submit, -ESHUTDOWN);
    cr_assert_eq(T10.rc_keyed, -ESHUTDOWN);
    cr_assert_eq(T10.rc_handle, -ESHUTDOWN);
    cr_assert_eq(T10.rc_group, -ESHUTDOWN);
    cr_assert_eq(T10.rc_async, -ESHUTDOWN);
    cr_assert_eq(T10.rc_batch, -ESHUTDOWN);
    cr_assert_eq(T10.rc_timed, -ESHUTDOWN);
    cr_assert_eq(T10.rc_arm, 0);
    cr_assert_eq(tko_handle_id(&T10.h), 0);
    cr_assert_eq(tko_handle_status(&T10.h), -EINVAL);
    cr_assert_eq(tko_group_pending(&T10.g), 0);
    cr_assert_eq(tko_group_destroy(&T10.g), 0);
    cr_assert_eq(atomic_load(&T10.probe.ran), 0);
    cr_assert_eq(atomic_load(&T10.probe.oc), 0);
    cr_assert_eq(atomic_load(&T10.t1.ran), 1);
    cr_assert_eq(atomic_load(&T10.t2.ran), 1);
    cr_assert_eq(atomic_load(&T10.t1.oc) + atomic_load(&T10.t2.oc), 0);
    cr_assert_eq(atomic_load(&T10.async_it.completes), 1);
    tko_stats st;
    tko_pool_stats(T10.pool, &st);
    cr_assert_geq(st.caller_runs, 2);
    assert_quiet_stats(T10.pool);
    cr_assert_eq(tko_pool_destroy(T10.pool), 0);
    /* Arming once the pool is stopped, and after destroy, is refused. */
    tt_count_fini(&T10.started);
  }
  wd_stop(&w);
}

/* ======================================================================
 * 11. Everything at once, then four shutdowns in different modes from four
 * threads and a destroy: plain tasks, handles (some waited on by tasks that
 * help), group members, keyed tasks, async tasks completed by timers armed
 * from their start (with the timer's on_cancel as the host's fallback),
 * periodic timers. Every task ends exactly once; every shutdown returns a
 * code it may; stats add up.
 * ==================================================================== */

#define T11_N 64

static struct {
  tko_pool *pool;
  item plain[T11_N], handled[T11_N], member[T11_N], keyed[T11_N], async[T11_N], atimer[T11_N],
      periodic[4];
  tko_group g;
  atomic_int timer_oc_while_inflight;
  atomic_int bad;
  int rc[4];
  tt_gate go;
} T11;

static void t11_timer_oc(item *t) {
  /* The host's fallback. A CANCEL shutdown may drop a firing already queued
   * (an ordinary task: its on_cancel is the host's to complete the async
   * task); but the timers' close, whose on_cancel has an id with the top bit
   * set, comes only after in-flight async tasks completed. */
  if ((atomic_load(&t->oc_id) >> 63) && atomic_load(&t->target->op))
    atomic_fetch_add(&T11.timer_oc_while_inflight, 1);
  complete_target(t->target);
}

static int t11_async_start(tko_async *op, void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  atomic_store(&it->op, op);
  item *t = &T11.atimer[it->idx];
  int rc = tko_submit_after(T11.pool, &t->timer, it->idx % 3, timer_fn, t, it->idx % 5);
  atomic_store(&t->arm_rc, rc);
  if (rc != 0) {
    fprintf(stderr, "timer armed from an async start during the run: %d (%s)\n", rc,
            tko_err_name(rc));
    atomic_fetch_add(&T11.bad, 1);
    atomic_store(&it->op, NULL);
    return 1; /* completes at once */
  }
  return 0;
}

static int t11_helper(void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  /* Waits on a handle of another queued task: helping. */
  item *h = &T11.handled[(it->idx * 7 + 3) % T11_N];
  int rc = tko_handle_wait(&h->handle, -1);
  if (rc != 0 && rc != -EDEADLK) {
    fprintf(stderr, "handle wait in a task: %d (%s)\n", rc, tko_err_name(rc));
    atomic_fetch_add(&T11.bad, 1);
  }
  return 0;
}

static void *t11_shutter(void *arg) {
  int k = (int)(intptr_t)arg;
  tt_gate_wait(&T11.go);
  int rc;
  switch (k) {
  case 0:
    rc = tko_pool_shutdown(T11.pool, TKO_DRAIN);
    break;
  case 1:
    rc = tko_pool_shutdown(T11.pool, TKO_CANCEL);
    break;
  case 2:
    rc = tko_pool_shutdown_timed(T11.pool, TKO_CANCEL_NOWAIT, 0);
    break;
  default:
    while ((rc = tko_pool_shutdown_timed(T11.pool, TKO_DRAIN, 1)) == -ETIMEDOUT) {
    }
    break;
  }
  T11.rc[k] = rc;
  return NULL;
}

static void t11_round(int r) {
  T11.pool = make_pool_hooks(2, r % 2 ? 2 : 0, r % 3 ? 0 : 4);
  atomic_store(&T11.timer_oc_while_inflight, 0);
  atomic_store(&T11.bad, 0);
  tt_gate go = TT_GATE_INIT;
  T11.go = go;
  cr_assert_eq(tko_group_init(&T11.g), 0);
  for (int i = 0; i < T11_N; i++) {
    item_init(&T11.plain[i], K_PLAIN, i);
    item_init(&T11.handled[i], K_PLAIN, i);
    item_init(&T11.member[i], K_PLAIN, i);
    item_init(&T11.keyed[i], K_KEYED, i);
    item_init(&T11.async[i], K_ASYNC, i);
    item_init(&T11.atimer[i], K_ONESHOT, i);
    T11.atimer[i].target = &T11.async[i];
    T11.atimer[i].on_cancel_cb = t11_timer_oc;
  }
  for (int i = 0; i < 4; i++) {
    item_init(&T11.periodic[i], K_PERIODIC, i);
    cr_assert_eq(tko_submit_every(T11.pool, &T11.periodic[i].timer, 1 + i, timer_fn,
                                  &T11.periodic[i], i),
                 0);
  }
  for (int i = 0; i < T11_N; i++) /* armed before any task waits on them */
    cr_assert_eq(tko_submit_handle(T11.pool, &T11.handled[i].handle, plain_fn, &T11.handled[i],
                                   i % 4 - 2),
                 0);
  for (int i = 0; i < T11_N; i++) {
    cr_assert_eq(tko_submit(T11.pool, i % 4 == 0 ? t11_helper : plain_fn, &T11.plain[i], i % 5), 0);
    cr_assert_eq(tko_group_submit(T11.pool, &T11.g, plain_fn, &T11.member[i], i % 3), 0);
    cr_assert_eq(tko_submit_keyed(T11.pool, (uint64_t)(i % 5), plain_fn, &T11.keyed[i], i), 0);
    cr_assert_eq(tko_submit_async(T11.pool, t11_async_start, &T11.async[i], i % 7 - 3), 0);
  }
  pthread_t th[4];
  for (int k = 0; k < 4; k++)
    cr_assert_eq(pthread_create(&th[k], NULL, t11_shutter, (void *)(intptr_t)k), 0);
  tt_gate_open(&T11.go);
  for (int k = 0; k < 4; k++) pthread_join(th[k], NULL);
  for (int k = 0; k < 4; k++) {
    int rc = T11.rc[k];
    bool ok = rc == 0 || (k == 2 && rc == -ETIMEDOUT);
    if (!ok) {
      fprintf(stderr, "shutdown caller %d: %d (%s)\n", k, rc, tko_err_name(rc));
      cr_assert(0);
    }
  }
  /* Shutdown calls 0, 1 and 3 returned 0: the pool is stopped. */
  assert_quiet_stats(T11.pool);
  cr_assert_eq(tko_pool_destroy(T11.pool), 0);
  cr_assert_eq(atomic_load(&T11.bad), 0);
  cr_assert_eq(atomic_load(&T11.timer_oc_while_inflight), 0);
  for (int i = 0; i < T11_N; i++) {
    item *set[] = {&T11.plain[i], &T11.handled[i], &T11.member[i], &T11.keyed[i], &T11.async[i]};
    for (int s = 0; s < 5; s++) {
      int ran = atomic_load(&set[s]->ran), oc = atomic_load(&set[s]->oc);
      if (ran + oc != 1) {
        fprintf(stderr, "round %d kind %d item %d: ran %d on_cancel %d\n", r, set[s]->kind, i, ran,
                oc);
        cr_assert(0);
      }
    }
    item *a = &T11.async[i];
    if (atomic_load(&a->ran)) {
      cr_assert_eq(atomic_load(&a->completes), 1);
      cr_assert_eq(atomic_load(&a->complete_bad), 0);
      item *t = &T11.atimer[i];
      cr_assert_eq(atomic_load(&t->ran) + atomic_load(&t->oc), 1);
    }
    int hs = tko_handle_status(&T11.handled[i].handle);
    cr_assert_eq(hs, atomic_load(&T11.handled[i].oc) ? -ECANCELED : 0);
  }
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(atomic_load(&T11.periodic[i].oc), 1);
    cr_assert_eq(atomic_load(&T11.periodic[i].after_oc), 0);
    cr_assert_eq(atomic_load(&T11.periodic[i].overlap), 0);
  }
  cr_assert_eq(tko_group_pending(&T11.g), 0);
  cr_assert_eq(tko_group_destroy(&T11.g), 0);
}

Test(attack_interplay, every_feature_then_four_concurrent_shutdowns_and_a_destroy) {
  watchdog w;
  wd_start(&w, "every_feature_then_four_concurrent_shutdowns_and_a_destroy");
  for (int r = 0; r < TT_SCALE(12, 3); r++) t11_round(r);
  wd_stop(&w);
}

/* ======================================================================
 * 12. A fork-join tree of handle waits on an elastic-only pool whose workers
 * retire after 1 ms idle, with resizes racing: every node runs once, no wait
 * hangs, and a wait past the help depth is -EDEADLK, never anything else.
 * ==================================================================== */

static struct {
  tko_pool *pool;
  atomic_int nodes, bad, deadlk;
  atomic_int stop;
} T12;

typedef struct t12_node {
  int depth;
} t12_node;

static int t12_fn(void *arg) {
  t12_node *n = arg;
  atomic_fetch_add(&T12.nodes, 1);
  if (n->depth == 0) return 0;
  tko_handle h[3];
  t12_node kids[3];
  bool armed[3] = {false, false, false};
  for (int i = 0; i < 3; i++) {
    kids[i].depth = n->depth - 1;
    int rc = tko_submit_handle(T12.pool, &h[i], t12_fn, &kids[i], i - 1);
    if (rc == 0) armed[i] = true;
    else {
      atomic_fetch_add(&T12.bad, 1);
      fprintf(stderr, "node submit: %d\n", rc);
    }
  }
  for (int i = 2; i >= 0; i--) {
    if (!armed[i]) continue;
    int rc = tko_handle_wait(&h[i], -1);
    if (rc == -EDEADLK) {
      atomic_fetch_add(&T12.deadlk, 1);
      /* The library refused to help deeper: the kid still runs elsewhere. */
      while ((rc = tko_handle_wait(&h[i], 0)) == -ETIMEDOUT || rc == -EDEADLK) sched_yield();
    }
    if (rc != 0) {
      atomic_fetch_add(&T12.bad, 1);
      fprintf(stderr, "node wait: %d (%s)\n", rc, tko_err_name(rc));
    }
  }
  return 0;
}

static void *t12_resizer(void *arg) {
  (void)arg;
  unsigned k = 0;
  while (!atomic_load(&T12.stop)) {
    int rc = tko_pool_resize(T12.pool, k % 3 == 0 ? 1 : 0, 1 + k % 3);
    if (rc != 0 && rc != -EAGAIN) {
      fprintf(stderr, "resize: %d (%s)\n", rc, tko_err_name(rc));
      atomic_fetch_add(&T12.bad, 1);
    }
    k++;
    sched_yield();
  }
  return NULL;
}

Test(attack_interplay, handle_fork_join_on_a_churning_elastic_only_pool) {
  watchdog w;
  wd_start(&w, "handle_fork_join_on_a_churning_elastic_only_pool");
  for (int r = 0; r < TT_SCALE(6, 2); r++) {
    tko_options o = tko_elastic_options(0, 2, 1);
    o.max_threads = 8;
    o.hooks.on_cancel = oc_hook;
    cr_assert_eq(tko_pool_create(&T12.pool, &o), 0);
    atomic_store(&T12.nodes, 0);
    atomic_store(&T12.bad, 0);
    atomic_store(&T12.deadlk, 0);
    atomic_store(&T12.stop, 0);
    pthread_t rs;
    cr_assert_eq(pthread_create(&rs, NULL, t12_resizer, NULL), 0);
    t12_node root = {5};
    tko_handle h;
    cr_assert_eq(tko_submit_handle(T12.pool, &h, t12_fn, &root, 0), 0);
    cr_assert_eq(tko_handle_wait(&h, TT_LONG_MS), 0);
    atomic_store(&T12.stop, 1);
    pthread_join(rs, NULL);
    cr_assert_eq(tko_pool_wait_idle(T12.pool, TT_LONG_MS), 0);
    assert_quiet_stats(T12.pool);
    cr_assert_eq(tko_pool_destroy(T12.pool), 0);
    cr_assert_eq(atomic_load(&T12.bad), 0);
    cr_assert_eq(atomic_load(&T12.nodes), 1 + 3 + 9 + 27 + 81 + 243);
  }
  wd_stop(&w);
}

/* ======================================================================
 * 13. fork(): in the child every call on the parent's pool, its armed timer,
 * its pending handle, its group and its in-flight async task is -ECHILD and
 * runs nothing; destroy returns 0.
 * ==================================================================== */

#ifndef TT_SANITIZED
static struct {
  item async_it, timer_it, handled, member, probe;
  tt_count started;
} T13;

static int t13_async_start(tko_async *op, void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  atomic_store(&it->op, op);
  tt_count_add(&T13.started, 1);
  return 0;
}

#endif

#define CHILD_EXPECT(call, want)                                                    \
  do {                                                                              \
    long got_ = (long)(call);                                                       \
    if (got_ != (long)(want)) {                                                     \
      fprintf(stderr, "child: %s = %ld (%s), want %ld\n", #call, got_,               \
              tko_err_name((int)got_), (long)(want));                               \
      fails++;                                                                      \
    }                                                                               \
  } while (0)

Test(attack_interplay, a_forked_child_gets_echild_from_every_feature_of_the_parents_pool) {
#ifdef TT_SANITIZED
  cr_skip_test("fork with pool threads under a sanitizer");
#else
  watchdog w;
  wd_start(&w, "a_forked_child_gets_echild_from_every_feature_of_the_parents_pool");
  tko_pool *p = make_pool_hooks(1, 0, 0);
  tt_pin pin = TT_PIN_INIT;
  item_init(&T13.async_it, K_ASYNC, 0);
  item_init(&T13.timer_it, K_ONESHOT, 1);
  item_init(&T13.handled, K_PLAIN, 2);
  item_init(&T13.member, K_PLAIN, 3);
  item_init(&T13.probe, K_PLAIN, 4);
  tt_count_init(&T13.started);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_submit_async(p, t13_async_start, &T13.async_it, 10), 0);
  cr_assert(tt_count_wait_geq(&T13.started, 1));
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 9), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_submit_handle(p, &T13.handled.handle, plain_fn, &T13.handled, 0), 0);
  cr_assert_eq(tko_group_submit(p, &g, plain_fn, &T13.member, 0), 0);
  cr_assert_eq(tko_submit_after(p, &T13.timer_it.timer, 3600000, timer_fn, &T13.timer_it, 0), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    int fails = 0;
    tko_timer t2;
    tko_timer_init(&t2);
    tko_handle h2;
    tko_task task = {plain_fn, &T13.probe, 0};
    CHILD_EXPECT(tko_submit(p, plain_fn, &T13.probe, 0), -ECHILD);
    CHILD_EXPECT(tko_submit_timed(p, plain_fn, &T13.probe, 0, 0), -ECHILD);
    CHILD_EXPECT(tko_submit_batch(p, &task, 1), -ECHILD);
    CHILD_EXPECT(tko_submit_keyed(p, 1, plain_fn, &T13.probe, 0), -ECHILD);
    CHILD_EXPECT(tko_submit_handle(p, &h2, plain_fn, &T13.probe, 0), -ECHILD);
    CHILD_EXPECT(tko_submit_async(p, t13_async_start, &T13.probe, 0), -ECHILD);
    CHILD_EXPECT(tko_group_submit(p, &g, plain_fn, &T13.probe, 0), -ECHILD);
    CHILD_EXPECT(tko_submit_after(p, &t2, 0, timer_fn, &T13.probe, 0), -ECHILD);
    CHILD_EXPECT(tko_submit_every(p, &t2, 1, timer_fn, &T13.probe, 0), -ECHILD);
    CHILD_EXPECT(tko_timer_cancel(&T13.timer_it.timer), -ECHILD);
    CHILD_EXPECT(tko_async_complete(atomic_load(&T13.async_it.op), 0), -ECHILD);
    CHILD_EXPECT(tko_handle_cancel(&T13.handled.handle), -ECHILD);
    CHILD_EXPECT(tko_handle_wait(&T13.handled.handle, -1), -ECHILD);
    CHILD_EXPECT(tko_group_wait(&g, -1), -ECHILD);
    CHILD_EXPECT(tko_group_cancel(&g), -ECHILD);
    CHILD_EXPECT(tko_pool_wait_idle(p, -1), -ECHILD);
    CHILD_EXPECT(tko_pool_pause(p), -ECHILD);
    CHILD_EXPECT(tko_pool_resume(p), -ECHILD);
    CHILD_EXPECT(tko_pool_resize(p, 2, 0), -ECHILD);
    CHILD_EXPECT(tko_pool_trim(p), -ECHILD);
    CHILD_EXPECT(tko_pool_shutdown_timed(p, TKO_CANCEL_NOWAIT, 0), -ECHILD);
    CHILD_EXPECT(tko_pool_shutdown(p, TKO_CANCEL), -ECHILD);
    CHILD_EXPECT(tko_pool_destroy(p), 0);
    if (atomic_load(&T13.probe.ran) || atomic_load(&T13.probe.oc)) {
      fprintf(stderr, "child: a refused task ran or was cancelled\n");
      fails++;
    }
    tt_child_exit(fails ? 10 + fails : 0);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fprintf(stderr, "child status %d (exit %d)\n", status,
            WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  cr_assert(WIFEXITED(status));
  cr_assert_eq(WEXITSTATUS(status), 0);
  /* The parent's pool is untouched by the child. */
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_handle_wait(&T13.handled.handle, TT_LONG_MS), 0);
  cr_assert_eq(tko_group_wait(&g, TT_LONG_MS), 0);
  cr_assert_eq(tko_timer_cancel(&T13.timer_it.timer), 0);
  complete_target(&T13.async_it);
  cr_assert_eq(atomic_load(&T13.async_it.completes), 1);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  assert_quiet_stats(p);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&T13.handled.ran), 1);
  cr_assert_eq(atomic_load(&T13.member.ran), 1);
  cr_assert_eq(atomic_load(&T13.timer_it.ran) + atomic_load(&T13.timer_it.oc), 0);
  tt_count_fini(&T13.started);
  wd_stop(&w);
#endif
}

/* ======================================================================
 * 14. Extreme values and NULLs on the timer, async, handle and shutdown
 * calls.
 * ==================================================================== */

static int t14_async_nonzero(tko_async *op, void *arg) {
  (void)op;
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  return -EIO;
}

Test(attack_interplay, extreme_values_and_nulls_get_the_documented_errors) {
  watchdog w;
  wd_start(&w, "extreme_values_and_nulls_get_the_documented_errors");
  tko_pool *p = make_pool_hooks(1, 0, 0);
  item it;
  item_init(&it, K_ONESHOT, 0);
  cr_assert_eq(tko_submit_after(p, &it.timer, -1, timer_fn, &it, 0), -EINVAL);
  cr_assert_eq(tko_submit_after(p, &it.timer, LONG_MIN, timer_fn, &it, 0), -EINVAL);
  cr_assert_eq(tko_submit_after(p, &it.timer, LONG_MAX, timer_fn, &it, 0), -EINVAL);
  cr_assert_eq(tko_submit_after(p, &it.timer, (long)TKO_MAX_TIMER_MS + 1, timer_fn, &it, 0),
               -EINVAL);
  cr_assert_eq(tko_submit_every(p, &it.timer, 0, timer_fn, &it, 0), -EINVAL);
  cr_assert_eq(tko_submit_every(p, &it.timer, -1, timer_fn, &it, 0), -EINVAL);
  cr_assert_eq(tko_submit_every(p, &it.timer, LONG_MAX, timer_fn, &it, 0), -EINVAL);
  cr_assert_eq(tko_submit_after(NULL, &it.timer, 0, timer_fn, &it, 0), -EINVAL);
  cr_assert_eq(tko_submit_after(p, NULL, 0, timer_fn, &it, 0), -EINVAL);
  cr_assert_eq(tko_submit_after(p, &it.timer, 0, NULL, &it, 0), -EINVAL);
  cr_assert_eq(tko_timer_cancel(&it.timer), -ENOENT);
  /* The longest delay and period are accepted, and cancel disarms them. */
  cr_assert_eq(tko_submit_after(p, &it.timer, (long)TKO_MAX_TIMER_MS, timer_fn, &it, INT_MIN), 0);
  cr_assert_eq(tko_submit_after(p, &it.timer, 0, timer_fn, &it, 0), -EBUSY);
  cr_assert_eq(tko_timer_cancel(&it.timer), 0);
  cr_assert_eq(tko_timer_cancel(&it.timer), -ENOENT);
  cr_assert_eq(tko_submit_every(p, &it.timer, (long)TKO_MAX_TIMER_MS, timer_fn, &it, INT_MAX), 0);
  cr_assert_eq(tko_timer_cancel(&it.timer), 0);
  /* Async: NULLs, a non-zero start at INT_MIN / INT_MAX weights. */
  cr_assert_eq(tko_async_complete(NULL, 0), -EINVAL);
  cr_assert_eq(tko_submit_async(p, NULL, &it, 0), -EINVAL);
  cr_assert_eq(tko_submit_async(NULL, t14_async_nonzero, &it, 0), -EINVAL);
  item a1, a2;
  item_init(&a1, K_ASYNC, 1);
  item_init(&a2, K_ASYNC, 2);
  cr_assert_eq(tko_submit_async(p, t14_async_nonzero, &a1, INT_MIN), 0);
  cr_assert_eq(tko_submit_async(p, t14_async_nonzero, &a2, INT_MAX), 0);
  /* Handles: bad timeouts, unarmed handles. */
  tko_handle h;
  memset(&h, 0, sizeof h);
  cr_assert_eq(tko_handle_wait(&h, 0), -EINVAL);
  cr_assert_eq(tko_handle_cancel(&h), -EINVAL);
  cr_assert_eq(tko_handle_status(&h), -EINVAL);
  cr_assert_eq(tko_handle_id(&h), 0);
  item hi;
  item_init(&hi, K_PLAIN, 3);
  cr_assert_eq(tko_submit_handle(p, &hi.handle, plain_fn, &hi, INT_MIN), 0);
  cr_assert_eq(tko_handle_wait(&hi.handle, -2), -EINVAL);
  cr_assert_eq(tko_handle_wait(&hi.handle, LONG_MIN), -EINVAL);
  cr_assert_eq(tko_handle_wait(&hi.handle, LONG_MAX), 0);
  cr_assert_eq(tko_handle_status(&hi.handle), 0);
  cr_assert_eq(tko_handle_cancel(&hi.handle), -EBUSY);
  /* Keyed: extreme keys and weights. */
  item k1, k2;
  item_init(&k1, K_KEYED, 4);
  item_init(&k2, K_KEYED, 5);
  cr_assert_eq(tko_submit_keyed(p, 0, plain_fn, &k1, INT_MIN), 0);
  cr_assert_eq(tko_submit_keyed(p, UINT64_MAX, plain_fn, &k2, INT_MAX), 0);
  cr_assert_eq(tko_submit_keyed(p, 1, NULL, &k2, 0), -EINVAL);
  cr_assert_eq(tko_submit_keyed(NULL, 1, plain_fn, &k2, 0), -EINVAL);
  /* Waits with huge timeouts return once idle. */
  cr_assert_eq(tko_pool_wait_idle(p, LONG_MAX), 0);
  int rc = tko_pool_wait_idle(p, -2);
  cr_assert(rc == 0 || rc == -EINVAL);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  cr_assert_eq(tko_group_wait(&g, LONG_MAX), 0);
  cr_assert_eq(tko_group_wait(&g, 0), 0);
  cr_assert_eq(tko_group_cancel(&g), 0);
  cr_assert_eq(tko_group_destroy(&g), 0);
  /* Shutdown: bad modes. */
  cr_assert_eq(tko_pool_shutdown(p, (tko_shutdown_mode)7), -EINVAL);
  cr_assert_eq(tko_pool_shutdown(p, (tko_shutdown_mode)-1), -EINVAL);
  cr_assert_eq(tko_pool_shutdown_timed(p, (tko_shutdown_mode)3, 0), -EINVAL);
  cr_assert_eq(tko_pool_shutdown(NULL, TKO_DRAIN), -EINVAL);
  cr_assert_eq(tko_pool_shutdown_timed(NULL, TKO_DRAIN, 0), -EINVAL);
  cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0); /* still running after the refusals */
  cr_assert_eq(tko_pool_shutdown_timed(p, TKO_DRAIN, LONG_MAX), 0);
  assert_quiet_stats(p);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq(st.failed, 2);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&a1.ran), 1);
  cr_assert_eq(atomic_load(&a2.ran), 1);
  cr_assert_eq(atomic_load(&k1.ran), 1);
  cr_assert_eq(atomic_load(&k2.ran), 1);
  cr_assert_eq(atomic_load(&it.ran) + atomic_load(&it.oc), 0);
  wd_stop(&w);
}

/* ======================================================================
 * 15. A timed shutdown with a huge timeout while a keyed task runs (the
 * default lane table is attached, so the shutdown's CLOSING step waits for
 * it): the call must wait like -1, then return 0 - not time out at once,
 * and not overflow computing its deadline.
 * ==================================================================== */

static struct {
  tko_pool *pool;
  long timeout;
  tko_shutdown_mode mode;
  int rc;
  tt_count done;
} T15;

static void *t15_shutter(void *arg) {
  (void)arg;
  T15.rc = tko_pool_shutdown_timed(T15.pool, T15.mode, T15.timeout);
  tt_count_add(&T15.done, 1);
  return NULL;
}

Test(attack_interplay, a_huge_timed_shutdown_waits_for_a_running_keyed_task) {
  watchdog w;
  wd_start(&w, "a_huge_timed_shutdown_waits_for_a_running_keyed_task");
  const long huge[] = {LONG_MAX, LONG_MAX - 1, LONG_MAX / 1000 + 1, LONG_MAX / 1000000 + 1,
                       (long)TKO_MAX_TIMER_MS * 1000};
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++)
    for (int m = 0; m < 2; m++) {
      T15.pool = make_pool_hooks(1, 0, 0);
      T15.timeout = huge[i];
      T15.mode = m ? TKO_CANCEL : TKO_DRAIN;
      tt_count_init(&T15.done);
      tt_pin pin = TT_PIN_INIT;
      item after;
      item_init(&after, K_KEYED, 0);
      cr_assert_eq(tko_submit_keyed(T15.pool, 42, tt_pin_fn, &pin, 0), 0);
      cr_assert_eq(tko_submit_keyed(T15.pool, 42, plain_fn, &after, 0), 0);
      cr_assert(tt_count_wait_geq(&pin.started, 1));
      pthread_t th;
      cr_assert_eq(pthread_create(&th, NULL, t15_shutter, NULL), 0);
      /* It must not return while the keyed task still runs. */
      bool early = tt_count_wait_geq_within(&T15.done, 1, 200);
      tt_gate_open(&pin.gate);
      pthread_join(th, NULL);
      if (early || T15.rc != 0) {
        fprintf(stderr, "shutdown_timed(mode %d, %ld): %d (%s)%s\n", m, huge[i], T15.rc,
                tko_err_name(T15.rc), early ? " before the running keyed task returned" : "");
        cr_assert(0);
      }
      assert_quiet_stats(T15.pool);
      cr_assert_eq(atomic_load(&after.ran) + atomic_load(&after.oc), 1);
      cr_assert_eq(tko_pool_destroy(T15.pool), 0);
      tt_count_fini(&T15.done);
    }
  wd_stop(&w);
}

/* ======================================================================
 * 16. An async member's start function is the member's task: waiting on its
 * own group there is -EDEADLK at once (not a hang), and so are the pool's
 * wait_idle, shutdown and destroy; waiting on another group of the pool
 * helps and returns 0.
 * ==================================================================== */

static struct {
  tko_pool *pool;
  tko_group own, other;
  item member, other_member;
  int own_rc, idle_rc, shut_rc, destroy_rc, other_rc;
  tt_count started;
} T16;

static int t16_start(tko_async *op, void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  T16.own_rc = tko_group_wait(&T16.own, -1);
  T16.idle_rc = tko_pool_wait_idle(T16.pool, -1);
  T16.shut_rc = tko_pool_shutdown_timed(T16.pool, TKO_CANCEL_NOWAIT, 0);
  T16.destroy_rc = tko_pool_destroy(T16.pool);
  if (tko_group_submit(T16.pool, &T16.other, plain_fn, &T16.other_member, -10) == 0)
    T16.other_rc = tko_group_wait(&T16.other, -1);
  else T16.other_rc = -999;
  atomic_store(&it->op, op);
  tt_count_add(&T16.started, 1);
  return 0;
}

Test(attack_interplay, an_async_members_start_waiting_on_its_own_group_gets_edeadlk) {
  watchdog w;
  wd_start(&w, "an_async_members_start_waiting_on_its_own_group_gets_edeadlk");
  for (unsigned workers = 1; workers <= 2; workers++) {
    T16.pool = make_pool_hooks(workers, 0, 0);
    item_init(&T16.member, K_ASYNC, 0);
    item_init(&T16.other_member, K_PLAIN, 1);
    tt_count_init(&T16.started);
    cr_assert_eq(tko_group_init(&T16.own), 0);
    cr_assert_eq(tko_group_init(&T16.other), 0);
    cr_assert_eq(tko_group_submit_async(T16.pool, &T16.own, t16_start, &T16.member, 0), 0);
    cr_assert(tt_count_wait_geq(&T16.started, 1));
    if (T16.own_rc != -EDEADLK || T16.idle_rc != -EDEADLK || T16.shut_rc != -EDEADLK ||
        T16.destroy_rc != -EDEADLK || T16.other_rc != 0)
      fprintf(stderr, "async start: own wait %d, wait_idle %d, shutdown %d, destroy %d, other %d\n",
              T16.own_rc, T16.idle_rc, T16.shut_rc, T16.destroy_rc, T16.other_rc);
    cr_assert_eq(T16.own_rc, -EDEADLK);
    cr_assert_eq(T16.idle_rc, -EDEADLK);
    cr_assert_eq(T16.shut_rc, -EDEADLK);
    cr_assert_eq(T16.destroy_rc, -EDEADLK);
    cr_assert_eq(T16.other_rc, 0);
    cr_assert_eq(tko_group_pending(&T16.own), 1);
    complete_target(&T16.member);
    cr_assert_eq(tko_group_wait(&T16.own, TT_LONG_MS), 0);
    cr_assert_eq(tko_group_destroy(&T16.own), 0);
    cr_assert_eq(tko_group_destroy(&T16.other), 0);
    cr_assert_eq(tko_pool_shutdown(T16.pool, TKO_DRAIN), 0);
    assert_quiet_stats(T16.pool);
    cr_assert_eq(tko_pool_destroy(T16.pool), 0);
    cr_assert_eq(atomic_load(&T16.other_member.ran), 1);
    tt_count_fini(&T16.started);
  }
  wd_stop(&w);
}

/* ======================================================================
 * 17. Timers on an elastic-only pool whose only worker retires after 1 ms
 * idle: every firing still runs (a firing starts a worker), tasks fired by a
 * timer wait on handles they submit (helping on one elastic worker), and a
 * drain then hands what is still armed to on_cancel.
 * ==================================================================== */

#define T17_N 24

static struct {
  tko_pool *pool;
  item timers[T17_N], kids[T17_N], late;
  atomic_int bad;
  tt_count fired;
} T17;

static int t17_fn(void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  item *kid = &T17.kids[it->idx];
  int rc = tko_submit_handle(T17.pool, &kid->handle, plain_fn, kid, it->idx - 12);
  if (rc == 0) rc = tko_handle_wait(&kid->handle, -1);
  if (rc != 0) {
    fprintf(stderr, "timer task %d: %d (%s)\n", it->idx, rc, tko_err_name(rc));
    atomic_fetch_add(&T17.bad, 1);
  }
  tt_count_add(&T17.fired, 1);
  return 0;
}

Test(attack_interplay, timers_on_an_elastic_only_pool_whose_workers_retire) {
  watchdog w;
  wd_start(&w, "timers_on_an_elastic_only_pool_whose_workers_retire");
  for (int r = 0; r < TT_SCALE(4, 2); r++) {
    tko_options o = tko_elastic_options(0, 1 + r % 2, 1);
    o.hooks.on_cancel = oc_hook;
    cr_assert_eq(tko_pool_create(&T17.pool, &o), 0);
    atomic_store(&T17.bad, 0);
    tt_count_init(&T17.fired);
    for (int i = 0; i < T17_N; i++) {
      item_init(&T17.timers[i], K_ONESHOT, i);
      item_init(&T17.kids[i], K_PLAIN, i);
      cr_assert_eq(tko_submit_after(T17.pool, &T17.timers[i].timer, (i % 6) * 3, t17_fn,
                                    &T17.timers[i], i),
                   0);
    }
    item_init(&T17.late, K_ONESHOT, 99);
    cr_assert_eq(tko_submit_after(T17.pool, &T17.late.timer, 3600000, timer_fn, &T17.late, 0), 0);
    cr_assert(tt_count_wait_geq(&T17.fired, T17_N));
    cr_assert_eq(tko_pool_wait_idle(T17.pool, TT_LONG_MS), 0);
    cr_assert_eq(tko_pool_shutdown(T17.pool, TKO_DRAIN), 0);
    assert_quiet_stats(T17.pool);
    cr_assert_eq(tko_pool_destroy(T17.pool), 0);
    cr_assert_eq(atomic_load(&T17.bad), 0);
    for (int i = 0; i < T17_N; i++) {
      cr_assert_eq(atomic_load(&T17.timers[i].ran), 1);
      cr_assert_eq(atomic_load(&T17.kids[i].ran), 1);
    }
    cr_assert_eq(atomic_load(&T17.late.ran), 0);
    cr_assert_eq(atomic_load(&T17.late.oc), 1);
    tt_count_fini(&T17.fired);
  }
  wd_stop(&w);
}

/* ======================================================================
 * 18. A pause after the shutdown began, while an in-flight async task holds
 * the drain: a timer armed then, whose task completes the async task, must
 * let the shutdown end once the pool is resumed, and its task must run
 * exactly once (whether or not the pause holds a timer-thread task is the
 * library's choice; the scene asserts only the end state).
 * ==================================================================== */

static struct {
  tko_pool *pool;
  item async_it, timer_it;
  int shut_rc;
  tt_count started, shut_done;
} T18;

static int t18_start(tko_async *op, void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  atomic_store(&it->op, op);
  tt_count_add(&T18.started, 1);
  return 0;
}

static void *t18_shutter(void *arg) {
  (void)arg;
  T18.shut_rc = tko_pool_shutdown(T18.pool, TKO_DRAIN);
  tt_count_add(&T18.shut_done, 1);
  return NULL;
}

Test(attack_interplay, a_pause_during_a_shutdown_held_by_an_async_task_a_timer_completes) {
  watchdog w;
  wd_start(&w, "a_pause_during_a_shutdown_held_by_an_async_task_a_timer_completes");
  int held = 0, not_held = 0;
  for (int r = 0; r < TT_SCALE(10, 3); r++) {
    T18.pool = make_pool_hooks(1 + r % 2, 0, 0);
    item_init(&T18.async_it, K_ASYNC, 0);
    item_init(&T18.timer_it, K_ONESHOT, 1);
    T18.timer_it.target = &T18.async_it;
    tt_count_init(&T18.started);
    tt_count_init(&T18.shut_done);
    cr_assert_eq(tko_submit_async(T18.pool, t18_start, &T18.async_it, 0), 0);
    cr_assert(tt_count_wait_geq(&T18.started, 1));
    cr_assert_eq(tko_pool_shutdown_timed(T18.pool, TKO_DRAIN, 0), -ETIMEDOUT);
    cr_assert_eq(tko_pool_pause(T18.pool), 0);
    cr_assert_eq(tko_submit_after(T18.pool, &T18.timer_it.timer, 0, timer_fn, &T18.timer_it, 0),
                 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, t18_shutter, NULL), 0);
    if (tt_count_wait_geq_within(&T18.shut_done, 1, 100)) not_held++;
    else held++;
    cr_assert_eq(tko_pool_resume(T18.pool), 0);
    pthread_join(th, NULL);
    cr_assert_eq(T18.shut_rc, 0);
    assert_quiet_stats(T18.pool);
    cr_assert_eq(tko_pool_destroy(T18.pool), 0);
    cr_assert_eq(atomic_load(&T18.timer_it.ran), 1);
    cr_assert_eq(atomic_load(&T18.timer_it.oc), 0);
    cr_assert_eq(atomic_load(&T18.async_it.completes), 1);
    tt_count_fini(&T18.started);
    tt_count_fini(&T18.shut_done);
  }
  if (getenv("TKO_ATTACK_VERBOSE"))
    fprintf(stderr, "pause during shutdown: held %d, not held %d\n", held, not_held);
  wd_stop(&w);
}

/* The documented half of the scene above: with a task queued, a pause that
 * comes after the shutdown began holds the drain - the queued task does not
 * start and the shutdown does not return - until the resume. */
Test(attack_interplay, a_pause_during_a_shutdown_holds_a_queued_task_until_the_resume) {
  watchdog w;
  wd_start(&w, "a_pause_during_a_shutdown_holds_a_queued_task_until_the_resume");
  for (int r = 0; r < TT_SCALE(6, 2); r++) {
    T18.pool = make_pool_hooks(1, 0, 0);
    item_init(&T18.async_it, K_ASYNC, 0);
    item_init(&T18.timer_it, K_ONESHOT, 1);
    T18.timer_it.target = &T18.async_it;
    tt_count_init(&T18.started);
    tt_count_init(&T18.shut_done);
    tt_pin pin = TT_PIN_INIT;
    item queued;
    item_init(&queued, K_PLAIN, 2);
    cr_assert_eq(tko_submit_async(T18.pool, t18_start, &T18.async_it, 0), 0);
    cr_assert(tt_count_wait_geq(&T18.started, 1));
    cr_assert_eq(tko_submit(T18.pool, tt_pin_fn, &pin, 0), 0);
    cr_assert(tt_count_wait_geq(&pin.started, 1));
    cr_assert_eq(tko_submit(T18.pool, plain_fn, &queued, 0), 0);
    cr_assert_eq(tko_pool_shutdown_timed(T18.pool, r % 2 ? TKO_CANCEL : TKO_DRAIN, 0), -ETIMEDOUT);
    cr_assert_eq(tko_pool_pause(T18.pool), 0);
    tt_gate_open(&pin.gate);
    cr_assert_eq(tko_submit_after(T18.pool, &T18.timer_it.timer, 0, timer_fn, &T18.timer_it, 0),
                 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, t18_shutter, NULL), 0);
    bool done_while_paused = tt_count_wait_geq_within(&T18.shut_done, 1, 100);
    int ran_while_paused = atomic_load(&queued.ran);
    cr_assert_eq(tko_pool_resume(T18.pool), 0);
    pthread_join(th, NULL);
    if (ran_while_paused || (done_while_paused && r % 2 == 0))
      fprintf(stderr, "paused shutdown (mode %d): returned %d, queued task ran %d while paused\n",
              r % 2, done_while_paused, ran_while_paused);
    cr_assert_eq(ran_while_paused, 0);
    cr_assert_not(done_while_paused && r % 2 == 0);
    cr_assert_eq(T18.shut_rc, 0);
    assert_quiet_stats(T18.pool);
    cr_assert_eq(tko_pool_destroy(T18.pool), 0);
    cr_assert_eq(atomic_load(&queued.ran) + atomic_load(&queued.oc), 1);
    cr_assert_eq(atomic_load(&T18.timer_it.ran), 1);
    cr_assert_eq(atomic_load(&T18.async_it.completes), 1);
    tt_count_fini(&T18.started);
    tt_count_fini(&T18.shut_done);
  }
  wd_stop(&w);
}

/* ======================================================================
 * 19. on_cancel re-entering the cancellation that called it: each handle's
 * on_cancel cancels the next handle and the group (whose members the same
 * shutdown is cancelling), and asks wait_idle (-EDEADLK: on_cancel is the
 * pool's hook). Every task ends exactly once and the counts agree.
 * ==================================================================== */

#define T19_N 24

static struct {
  tko_pool *pool;
  item h[T19_N], m[T19_N];
  tko_group g;
  tt_pin *pin;
  atomic_int idle_bad;
  atomic_long group_cancelled;
  int shut_rc;
  tko_shutdown_mode mode;
} T19;

static void t19_cascade(item *it) {
  if (it->idx + 1 < T19_N) {
    int rc = tko_handle_cancel(&T19.h[it->idx + 1].handle);
    atomic_store(&T19.h[it->idx + 1].cancel_rc, rc);
  }
  long n = tko_group_cancel(&T19.g);
  if (n > 0) atomic_fetch_add(&T19.group_cancelled, n);
  else if (n < 0) atomic_fetch_add(&T19.idle_bad, 1);
  int rc = tko_pool_wait_idle(T19.pool, 0);
  if (rc != -EDEADLK) {
    fprintf(stderr, "wait_idle from on_cancel: %d (%s)\n", rc, tko_err_name(rc));
    atomic_fetch_add(&T19.idle_bad, 1);
  }
  if (it->idx == T19_N / 2) tt_gate_open(&T19.pin->gate);
}

static void *t19_shutter(void *arg) {
  (void)arg;
  if (T19.mode == TKO_CANCEL_NOWAIT)
    T19.shut_rc = tko_pool_shutdown_timed(T19.pool, TKO_CANCEL_NOWAIT, -1);
  else T19.shut_rc = tko_pool_shutdown(T19.pool, T19.mode);
  return NULL;
}

static void t19_round(int variant) {
  T19.pool = make_pool_hooks(1, 0, 0);
  tt_pin pin = TT_PIN_INIT;
  T19.pin = &pin;
  atomic_store(&T19.idle_bad, 0);
  atomic_store(&T19.group_cancelled, 0);
  T19.mode = variant == 0 ? TKO_CANCEL : TKO_CANCEL_NOWAIT;
  cr_assert_eq(tko_group_init(&T19.g), 0);
  cr_assert_eq(tko_submit(T19.pool, tt_pin_fn, &pin, INT_MAX), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  for (int i = 0; i < T19_N; i++) {
    item_init(&T19.h[i], K_PLAIN, i);
    item_init(&T19.m[i], K_PLAIN, i);
    T19.h[i].on_cancel_cb = t19_cascade;
    cr_assert_eq(tko_submit_handle(T19.pool, &T19.h[i].handle, plain_fn, &T19.h[i], -i), 0);
    cr_assert_eq(tko_group_submit(T19.pool, &T19.g, plain_fn, &T19.m[i], i), 0);
  }
  if (variant == 2) {
    /* Started by a host cancel on this thread, racing the shutdown. */
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, t19_shutter, NULL), 0);
    int rc = tko_handle_cancel(&T19.h[0].handle);
    atomic_store(&T19.h[0].cancel_rc, rc);
    pthread_join(th, NULL);
  } else {
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, t19_shutter, NULL), 0);
    pthread_join(th, NULL);
  }
  cr_assert_eq(T19.shut_rc, 0);
  tt_gate_open(&pin.gate); /* if no on_cancel reached the middle */
  cr_assert_eq(tko_pool_shutdown(T19.pool, TKO_DRAIN), 0);
  assert_quiet_stats(T19.pool);
  tko_stats st;
  tko_pool_stats(T19.pool, &st);
  long oc_total = 0, m_oc = 0;
  for (int i = 0; i < T19_N; i++) {
    item *h = &T19.h[i], *m = &T19.m[i];
    int hr = atomic_load(&h->ran), ho = atomic_load(&h->oc);
    int mr = atomic_load(&m->ran), mo = atomic_load(&m->oc);
    if (hr + ho != 1 || mr + mo != 1) {
      fprintf(stderr, "variant %d task %d: handle ran %d oc %d, member ran %d oc %d\n", variant, i,
              hr, ho, mr, mo);
      cr_assert(0);
    }
    int crc = atomic_load(&h->cancel_rc);
    bool ok = crc == 1 || (crc == 0 && ho) || (crc == -EALREADY && ho) || (crc == -EBUSY && hr);
    if (!ok) {
      fprintf(stderr, "variant %d handle %d: cancel %d (%s), ran %d oc %d\n", variant, i, crc,
              tko_err_name(crc), hr, ho);
      cr_assert(0);
    }
    cr_assert_eq(tko_handle_status(&h->handle), ho ? -ECANCELED : 0);
    if (getenv("TKO_ATTACK_VERBOSE") && crc != 1)
      fprintf(stderr, "v%d:%d ", variant, crc);
    oc_total += ho + mo;
    m_oc += mo;
  }
  cr_assert_eq((long)st.cancelled, oc_total);
  cr_assert_leq(atomic_load(&T19.group_cancelled), m_oc);
  cr_assert_eq(atomic_load(&T19.idle_bad), 0);
  cr_assert_eq(tko_group_pending(&T19.g), 0);
  cr_assert_eq(tko_group_destroy(&T19.g), 0);
  cr_assert_eq(tko_pool_destroy(T19.pool), 0);
}

Test(attack_interplay, on_cancel_reentering_handle_and_group_cancels_during_a_cancel_shutdown) {
  watchdog w;
  wd_start(&w, "on_cancel_reentering_handle_and_group_cancels_during_a_cancel_shutdown");
  for (int r = 0; r < TT_SCALE(30, 6); r++) t19_round(r % 3);
  wd_stop(&w);
}

/* ======================================================================
 * 20. The timers' close re-entered from on_cancel: each armed timer's
 * on_cancel cancels the next timer (which the close may be about to hand to
 * on_cancel) and re-arms its own timer once. Per timer: runs + on_cancels =
 * accepted armings - successful cancels.
 * ==================================================================== */

#define T20_N 16

static struct {
  tko_pool *pool;
  item t[T20_N];
  atomic_int rearmed[T20_N];
  atomic_int accepted[T20_N];
  atomic_int cancelled_ok[T20_N];
  atomic_int bad;
} T20;

static void t20_oc(item *it) {
  int next = (it->idx + 1) % T20_N;
  int rc = tko_timer_cancel(&T20.t[next].timer);
  if (rc == 0) atomic_fetch_add(&T20.cancelled_ok[next], 1);
  else if (rc != -ENOENT) atomic_fetch_add(&T20.bad, 1);
  if (atomic_exchange(&T20.rearmed[it->idx], 1) == 0) {
    rc = tko_submit_after(T20.pool, &it->timer, 0, timer_fn, it, 0);
    if (rc == 0) atomic_fetch_add(&T20.accepted[it->idx], 1);
    else if (rc != -ESHUTDOWN && rc != -EBUSY) {
      fprintf(stderr, "re-arm from on_cancel: %d (%s)\n", rc, tko_err_name(rc));
      atomic_fetch_add(&T20.bad, 1);
    }
  }
}

Test(attack_interplay, timer_on_cancels_that_cancel_and_rearm_timers_during_the_close) {
  watchdog w;
  wd_start(&w, "timer_on_cancels_that_cancel_and_rearm_timers_during_the_close");
  long v_rearm = 0, v_cancel = 0, v_ran = 0;
  for (int r = 0; r < TT_SCALE(30, 6); r++) {
    tko_shutdown_mode mode = (tko_shutdown_mode)(r % 3);
    T20.pool = make_pool_hooks(1 + r % 2, 0, 0);
    atomic_store(&T20.bad, 0);
    for (int i = 0; i < T20_N; i++) {
      item_init(&T20.t[i], i % 2 ? K_PERIODIC : K_ONESHOT, i);
      T20.t[i].on_cancel_cb = t20_oc;
      atomic_store(&T20.rearmed[i], 0);
      atomic_store(&T20.accepted[i], 1);
      atomic_store(&T20.cancelled_ok[i], 0);
      int rc = i % 2 ? tko_submit_every(T20.pool, &T20.t[i].timer, 3600000, timer_fn, &T20.t[i], 0)
                     : tko_submit_after(T20.pool, &T20.t[i].timer, 3600000, timer_fn, &T20.t[i], 0);
      cr_assert_eq(rc, 0);
    }
    shut(T20.pool, mode);
    assert_quiet_stats(T20.pool);
    cr_assert_eq(tko_pool_destroy(T20.pool), 0);
    cr_assert_eq(atomic_load(&T20.bad), 0);
    for (int i = 0; i < T20_N; i++) {
      int ran = atomic_load(&T20.t[i].ran), oc = atomic_load(&T20.t[i].oc);
      int acc = atomic_load(&T20.accepted[i]), cok = atomic_load(&T20.cancelled_ok[i]);
      if (ran + oc != acc - cok) {
        fprintf(stderr, "mode %d timer %d: ran %d on_cancel %d, accepted %d, cancelled %d\n",
                (int)mode, i, ran, oc, acc, cok);
        cr_assert(0);
      }
      cr_assert_eq(tko_timer_cancel(&T20.t[i].timer), -ENOENT);
      v_rearm += acc - 1;
      v_cancel += cok;
      v_ran += ran;
    }
  }
  if (getenv("TKO_ATTACK_VERBOSE"))
    fprintf(stderr, "close re-entry: re-arms accepted %ld, peer cancels 0 %ld, runs %ld\n",
            v_rearm, v_cancel, v_ran);
  wd_stop(&w);
}

/* ---- a completer thread for async tasks --------------------------------- */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  tko_async *op;
  int status;
  long done;
  bool stop;
  atomic_int bad;
} MB = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, false, 0};

static void *mb_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&MB.mu);
  for (;;) {
    while (!MB.stop && !MB.op) pthread_cond_wait(&MB.cv, &MB.mu);
    if (!MB.op) break;
    tko_async *op = MB.op;
    int status = MB.status;
    MB.op = NULL;
    pthread_mutex_unlock(&MB.mu);
    int rc = tko_async_complete(op, status);
    if (rc != 0) {
      fprintf(stderr, "completer: %d (%s)\n", rc, tko_err_name(rc));
      atomic_fetch_add(&MB.bad, 1);
    }
    pthread_mutex_lock(&MB.mu);
    MB.done++;
    pthread_cond_broadcast(&MB.cv);
  }
  pthread_mutex_unlock(&MB.mu);
  return NULL;
}

/* Hands op to the completer; returns the count its completion will make. */
static long mb_post(tko_async *op, int status) {
  struct timespec dl;
  tt_deadline(&dl, TT_LONG_MS);
  pthread_mutex_lock(&MB.mu);
  while (MB.op) /* one at a time */
    if (pthread_cond_timedwait(&MB.cv, &MB.mu, &dl) == ETIMEDOUT) break;
  MB.op = op;
  MB.status = status;
  long target = MB.done + 1;
  pthread_cond_broadcast(&MB.cv);
  pthread_mutex_unlock(&MB.mu);
  return target;
}

static bool mb_wait_done(long target) {
  struct timespec dl;
  tt_deadline(&dl, TT_LONG_MS);
  bool ok = true;
  pthread_mutex_lock(&MB.mu);
  while (MB.done < target && ok) ok = pthread_cond_timedwait(&MB.cv, &MB.mu, &dl) != ETIMEDOUT;
  ok = MB.done >= target;
  pthread_mutex_unlock(&MB.mu);
  return ok;
}

static pthread_t mb_start(void) {
  pthread_mutex_lock(&MB.mu);
  MB.stop = false;
  MB.op = NULL;
  pthread_mutex_unlock(&MB.mu);
  atomic_store(&MB.bad, 0);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, mb_main, NULL), 0);
  return th;
}

static void mb_stop(pthread_t th) {
  pthread_mutex_lock(&MB.mu);
  MB.stop = true;
  pthread_cond_broadcast(&MB.cv);
  pthread_mutex_unlock(&MB.mu);
  pthread_join(th, NULL);
}

/* ======================================================================
 * 21. A group freed the moment it is seen done: polled pending 0, a wait
 * that returned 0, or a zero-timeout wait that returned 0, then destroy (0)
 * and free at once - with plain members, async members completed on another
 * thread or by their own start, and members a racing group cancel drops.
 * The library must not touch the group after that (ASan sees it).
 * ==================================================================== */

static atomic_int T21_after_runs;

static int t21_self_complete(tko_async *op, void *arg) {
  (void)arg;
  return tko_async_complete(op, 0) == 0 ? 0 : 0;
}

static int t21_remote_complete(tko_async *op, void *arg) {
  (void)arg;
  mb_post(op, 0);
  return 0;
}

static void t21_after_run(void *user, const tko_task_info *t) {
  (void)user;
  (void)t;
  atomic_fetch_add(&T21_after_runs, 1);
}

Test(attack_interplay, a_group_freed_the_moment_it_is_seen_done) {
  watchdog w;
  wd_start(&w, "a_group_freed_the_moment_it_is_seen_done");
  tko_options o = tko_basic_options(2);
  o.hooks.after_run = t21_after_run;
  o.hooks.on_cancel = oc_hook;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  pthread_t mb = mb_start();
  atomic_store(&T21_after_runs, 0);
  long members = 0;
  for (int iter = 0; iter < TT_SCALE(3000, 400); iter++) {
    tko_group *g = malloc(sizeof *g);
    cr_assert_not_null(g);
    cr_assert_eq(tko_group_init(g), 0);
    int kind = iter % 6;
    switch (kind) {
    case 0:
    case 1:
      cr_assert_eq(tko_group_submit(p, g, tt_nop_fn, NULL, iter % 3), 0);
      members++;
      break;
    case 2:
      cr_assert_eq(tko_group_submit_async(p, g, t21_remote_complete, NULL, 0), 0);
      members++;
      break;
    case 3:
      cr_assert_eq(tko_group_submit_async(p, g, t21_self_complete, NULL, 0), 0);
      members++;
      break;
    default:
      for (int i = 0; i < 3; i++) {
        cr_assert_eq(tko_group_submit(p, g, tt_nop_fn, NULL, i), 0);
        members++;
      }
      cr_assert_geq(tko_group_cancel(g), 0);
      break;
    }
    switch (iter % 3) {
    case 0:
      while (tko_group_pending(g) != 0) sched_yield();
      break;
    case 1:
      cr_assert_eq(tko_group_wait(g, -1), 0);
      break;
    default: {
      int rc;
      while ((rc = tko_group_wait(g, 0)) == -ETIMEDOUT) sched_yield();
      cr_assert_eq(rc, 0);
    }
    }
    cr_assert_eq(tko_group_destroy(g), 0);
    memset(g, 0xA5, sizeof *g);
    free(g);
  }
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  assert_quiet_stats(p);
  tko_stats st;
  tko_pool_stats(p, &st);
  cr_assert_eq((long)(st.completed + st.cancelled), members);
  cr_assert_eq((long)atomic_load(&T21_after_runs), (long)st.completed);
  cr_assert_eq(tko_pool_destroy(p), 0);
  mb_stop(mb);
  cr_assert_eq(atomic_load(&MB.bad), 0);
  wd_stop(&w);
}

/* ======================================================================
 * 22. An async task completed by another thread while its start function is
 * still running (the start waits for that completion before it returns 0):
 * it ends once - one after_run, its group done with the completion's status,
 * wait_idle and every shutdown mode return, stats add up.
 * ==================================================================== */

static struct {
  atomic_int after_runs, failures;
  atomic_int early_bad;
} T22;

static int t22_start(tko_async *op, void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  long target = mb_post(op, it->idx % 2 ? -EIO : 0);
  if (!mb_wait_done(target)) atomic_fetch_add(&T22.early_bad, 1);
  return 0;
}

static void t22_after_run(void *user, const tko_task_info *t) {
  (void)user;
  item *it = t->arg;
  if (it && it->kind == K_ASYNC) atomic_fetch_add(&T22.after_runs, 1);
}

static void t22_on_failure(void *user, const tko_task_info *t) {
  (void)user;
  item *it = t->arg;
  if (it && it->kind == K_ASYNC) atomic_fetch_add(&T22.failures, 1);
}

Test(attack_interplay, an_async_task_completed_while_its_start_still_runs_ends_once) {
  watchdog w;
  wd_start(&w, "an_async_task_completed_while_its_start_still_runs_ends_once");
  pthread_t mb = mb_start();
  for (int r = 0; r < TT_SCALE(30, 6); r++) {
    tko_options o = tko_basic_options(1 + r % 2);
    o.hooks.after_run = t22_after_run;
    o.hooks.on_failure = t22_on_failure;
    o.hooks.on_cancel = oc_hook;
    o.max_async_inflight = r % 3;
    tko_pool *p;
    cr_assert_eq(tko_pool_create(&p, &o), 0);
    atomic_store(&T22.after_runs, 0);
    atomic_store(&T22.failures, 0);
    atomic_store(&T22.early_bad, 0);
    enum { N = 16 };
    static item its[N];
    tko_group g;
    cr_assert_eq(tko_group_init(&g), 0);
    for (int i = 0; i < N; i++) {
      item_init(&its[i], K_ASYNC, i);
      cr_assert_eq(tko_group_submit_async(p, &g, t22_start, &its[i], i % 4), 0);
    }
    tko_shutdown_mode mode = (tko_shutdown_mode)(r % 3);
    if (r % 2) cr_assert_eq(tko_group_wait(&g, TT_LONG_MS), 0);
    shut(p, mode);
    cr_assert_eq(tko_group_wait(&g, TT_LONG_MS), 0);
    assert_quiet_stats(p);
    int ran = 0, oc = 0;
    for (int i = 0; i < N; i++) {
      cr_assert_eq(atomic_load(&its[i].ran) + atomic_load(&its[i].oc), 1);
      ran += atomic_load(&its[i].ran);
      oc += atomic_load(&its[i].oc);
    }
    cr_assert_eq(atomic_load(&T22.after_runs), ran);
    cr_assert_eq(atomic_load(&T22.early_bad), 0);
    int failed_expected = 0;
    for (int i = 0; i < N; i++) failed_expected += atomic_load(&its[i].ran) && i % 2;
    cr_assert_eq(atomic_load(&T22.failures), failed_expected);
    int gs = tko_group_status(&g);
    cr_assert(gs == -EIO || gs == -ECANCELED);
    cr_assert_eq(tko_group_destroy(&g), 0);
    cr_assert_eq(tko_pool_destroy(p), 0);
    (void)oc;
  }
  mb_stop(mb);
  cr_assert_eq(atomic_load(&MB.bad), 0);
  wd_stop(&w);
}

/* ======================================================================
 * 23. tko_timer_cancel is "safe from any thread ... and after the pool is
 * destroyed": a thread that keeps cancelling timers the shutdown already
 * disarmed (each call -ENOENT) while the test thread destroys the pool.
 * ==================================================================== */

static struct {
  item t[13];
  atomic_int stop, bad;
  atomic_long calls;
  atomic_int ok[13];
  tt_count running, fired;
} T23;

static int t23_fn(void *arg) {
  item *it = arg;
  atomic_fetch_add(&it->ran, 1);
  tt_count_add(&T23.fired, 1);
  return 0;
}

static void *t23_canceller(void *arg) {
  (void)arg;
  tt_count_add(&T23.running, 1);
  while (!atomic_load(&T23.stop))
    for (int i = 0; i < 13; i++) {
      int rc = tko_timer_cancel(&T23.t[i].timer);
      atomic_fetch_add(&T23.calls, 1);
      if (rc == 0) atomic_fetch_add(&T23.ok[i], 1);
      else if (rc != -ENOENT) atomic_fetch_add(&T23.bad, 1);
    }
  return NULL;
}

/* Timers in every end state: disarmed by the close (one-shot, periodic),
 * fired and run, periodic cancelled after a run, one-shot cancelled, and
 * timers coming due around the shutdown. The canceller starts before the
 * shutdown and runs on through the destroy. */
Test(attack_interplay, timer_cancels_racing_the_pools_destroy_are_harmless) {
  watchdog w;
  wd_start(&w, "timer_cancels_racing_the_pools_destroy_are_harmless");
  for (int r = 0; r < TT_SCALE(300, 60); r++) {
    tko_pool *p = make_pool_hooks(1, 0, 0);
    tt_count_init(&T23.fired);
    for (int i = 0; i < 5; i++) item_init(&T23.t[i], i == 1 || i == 3 ? K_PERIODIC : K_ONESHOT, i);
    cr_assert_eq(tko_submit_after(p, &T23.t[0].timer, 3600000, t23_fn, &T23.t[0], 0), 0);
    cr_assert_eq(tko_submit_every(p, &T23.t[1].timer, 3600000, t23_fn, &T23.t[1], 0), 0);
    cr_assert_eq(tko_submit_after(p, &T23.t[2].timer, 0, t23_fn, &T23.t[2], 0), 0);
    cr_assert_eq(tko_submit_every(p, &T23.t[3].timer, 1, t23_fn, &T23.t[3], 0), 0);
    cr_assert_eq(tko_submit_after(p, &T23.t[4].timer, 3600000, t23_fn, &T23.t[4], 0), 0);
    cr_assert(tt_count_wait_geq(&T23.fired, 2));
    while (atomic_load(&T23.t[2].ran) == 0 || atomic_load(&T23.t[3].ran) == 0)
      cr_assert(tt_count_wait_geq(&T23.fired, tt_count_get(&T23.fired) + 1));
    cr_assert_eq(tko_timer_cancel(&T23.t[3].timer), 0);
    cr_assert_eq(tko_timer_cancel(&T23.t[4].timer), 0);
    /* And timers that come due around the shutdown. */
    for (int i = 5; i < 13; i++) {
      item_init(&T23.t[i], i % 2 ? K_PERIODIC : K_ONESHOT, i);
      int rc = i % 2 ? tko_submit_every(p, &T23.t[i].timer, 1 + i % 3, timer_fn, &T23.t[i], 0)
                     : tko_submit_after(p, &T23.t[i].timer, i % 4, timer_fn, &T23.t[i], 0);
      cr_assert_eq(rc, 0);
    }
    atomic_store(&T23.stop, 0);
    atomic_store(&T23.bad, 0);
    for (int i = 0; i < 13; i++) atomic_store(&T23.ok[i], 0);
    tt_count_init(&T23.running);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, t23_canceller, NULL), 0);
    cr_assert(tt_count_wait_geq(&T23.running, 1));
    cr_assert_eq(tko_pool_shutdown(p, (tko_shutdown_mode)(r % 2)), 0);
    cr_assert_eq(tko_pool_destroy(p), 0);
    atomic_store(&T23.stop, 1);
    pthread_join(th, NULL);
    cr_assert_eq(atomic_load(&T23.bad), 0);
    cr_assert_eq(atomic_load(&T23.t[0].oc) + atomic_load(&T23.ok[0]), 1);
    cr_assert_eq(atomic_load(&T23.t[0].ran), 0);
    cr_assert_leq(atomic_load(&T23.t[1].oc) + atomic_load(&T23.ok[1]), 1);
    cr_assert_eq(atomic_load(&T23.t[2].ran), 1);
    cr_assert_eq(atomic_load(&T23.t[4].ran) + atomic_load(&T23.t[4].oc), 0);
    for (int i = 0; i < 13; i++) cr_assert_leq(atomic_load(&T23.ok[i]), 1);
    for (int i = 6; i < 13; i += 2) { /* one-shots around the shutdown */
      int ran = atomic_load(&T23.t[i].ran), oc = atomic_load(&T23.t[i].oc);
      if (atomic_load(&T23.ok[i])) cr_assert_eq(ran + oc, 0);
      else cr_assert_eq(ran + oc, 1);
    }
    tt_count_fini(&T23.running);
    tt_count_fini(&T23.fired);
  }
  wd_stop(&w);
}
