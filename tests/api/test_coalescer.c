/* SPDX-License-Identifier: MIT */
/* Tests for the coalescer: latest value wins, one entry per key per sweep,
 * first-marked order, growth, every mark reflected in some flush under
 * concurrent marking with timer sweeps and on-demand flushes, the final
 * flush on close/destroy, marks racing with close (flushed or -ESHUTDOWN,
 * never lost), the timer sweeping inline when the pool is gone, a sweep task
 * dropped by a TKO_CANCEL shutdown (forwarded or not), and -EDEADLK. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <taskorch.h>
#include <taskorch/coalescer.h>

#include "tko_test.h"
#include "tko_test_sync.h"

static tko_pool *make_pool(unsigned workers) {
  tko_pool *p = NULL;
  tko_options o = tko_basic_options(workers);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  return p;
}

/* A flush log: the sweeps are serialized by the coalescer, so plain fields
 * written by flush_fn are race-free (TSan checks that claim too). */
#define LOG_MAX 20000
typedef struct flush_log {
  long sweeps;
  size_t n;
  tko_coalesce_entry e[LOG_MAX];
  size_t sweep_size[64];
  tko_coalescer *c;  /* for re-entrant calls */
  int mark_in_flush; /* marks key 999 from the first sweep */
  int flush_rc, close_rc, destroy_rc;
  pthread_t last_thread;
  tt_count flushed; /* entries flushed */
} flush_log;

static void log_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  flush_log *g = user;
  if (g->sweeps < 64) g->sweep_size[g->sweeps] = n;
  g->sweeps++;
  for (size_t i = 0; i < n && g->n < LOG_MAX; i++)
    g->e[g->n++] = e[i];
  g->last_thread = pthread_self();
  if (g->mark_in_flush) {
    g->mark_in_flush = 0;
    g->flush_rc = tko_coalescer_flush(g->c);
    g->close_rc = tko_coalescer_close(g->c);
    g->destroy_rc = tko_coalescer_destroy(g->c);
    cr_assert_eq(tko_coalescer_mark(g->c, 999, 1), 0);
  }
  tt_count_add(&g->flushed, (long)n);
}

static flush_log *log_new(void) {
  flush_log *g = calloc(1, sizeof *g);
  tt_count_init(&g->flushed);
  return g;
}

static void log_free(flush_log *g) {
  tt_count_fini(&g->flushed);
  free(g);
}

Test(coalescer, invalid_arguments) {
  tko_pool *p = make_pool(1);
  flush_log *g = log_new();
  tko_coalescer *c = (tko_coalescer *)&c;
  cr_assert_eq(tko_coalescer_create(NULL, p, 0, log_flush, g, NULL), -EINVAL);
  cr_assert_eq(tko_coalescer_create(&c, NULL, 0, log_flush, g, NULL), -EINVAL);
  cr_assert_null(c);
  cr_assert_eq(tko_coalescer_create(&c, p, 0, NULL, g, NULL), -EINVAL);
  cr_assert_eq(tko_coalescer_create(&c, p, TKO_MAX_COALESCE_INTERVAL_MS + 1, log_flush, g, NULL),
               -EINVAL);
  cr_assert_eq(tko_coalescer_mark(NULL, 1, 1), -EINVAL);
  cr_assert_eq(tko_coalescer_flush(NULL), -EINVAL);
  cr_assert_eq(tko_coalescer_close(NULL), -EINVAL);
  cr_assert_eq(tko_coalescer_destroy(NULL), -EINVAL);
  cr_assert_eq(tko_coalescer_pool_cancelled(NULL), 0);
  tko_task_info other = {0};
  cr_assert_eq(tko_coalescer_pool_cancelled(&other), 0);
  tko_coalesce_stats st;
  tko_coalescer_stats(NULL, &st);
  cr_assert_eq(tko_coalescer_create(&c, p, 0, log_flush, g, NULL), 0);
  tko_coalescer_stats(c, NULL);
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  cr_assert_eq(g->sweeps, 0); /* nothing marked: flush_fn never called */
  tko_pool_destroy(p);
  log_free(g);
}

Test(coalescer, latest_value_wins_once_per_sweep_in_first_marked_order) {
  tko_pool *p = make_pool(1);
  flush_log *g = log_new();
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, p, 0, log_flush, g, NULL), 0);
  for (uint64_t k = 0; k < 100; k++)
    cr_assert_eq(tko_coalescer_mark(c, k * 13, k), 0);
  for (uint64_t k = 0; k < 50; k++)
    cr_assert_eq(tko_coalescer_mark(c, k * 13, k + 1000), 0);
  tko_coalesce_stats st;
  tko_coalescer_stats(c, &st);
  cr_assert_eq(st.marks, 150);
  cr_assert_eq(st.dirty, 100);
  cr_assert_eq(tko_coalescer_flush(c), 0);
  cr_assert_eq(g->sweeps, 1);
  cr_assert_eq(g->n, 100);
  for (uint64_t k = 0; k < 100; k++) {
    cr_assert_eq(g->e[k].key, k * 13);
    cr_assert_eq(g->e[k].value, k < 50 ? k + 1000 : k);
  }
  cr_assert_eq(tko_coalescer_flush(c), 0); /* nothing dirty: no call */
  cr_assert_eq(g->sweeps, 1);
  tko_coalescer_stats(c, &st);
  cr_assert_eq(st.sweeps, 1);
  cr_assert_eq(st.flushed, 100);
  cr_assert_eq(st.max_sweep, 100);
  cr_assert_eq(st.dirty, 0);
  /* A key flushed before is flushed again after a new mark. */
  cr_assert_eq(tko_coalescer_mark(c, 13, 7), 0);
  cr_assert_eq(tko_coalescer_flush(c), 0);
  cr_assert_eq(g->sweeps, 2);
  cr_assert_eq(g->n, 101);
  cr_assert_eq(g->e[100].key, 13);
  cr_assert_eq(g->e[100].value, 7);
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  cr_assert_eq(g->sweeps, 2);
  tko_pool_destroy(p);
  log_free(g);
}

Test(coalescer, table_grows_and_keeps_every_key_once) {
  tko_pool *p = make_pool(1);
  flush_log *g = log_new();
  tko_coalesce_options o = {.initial_keys = 2};
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, p, 0, log_flush, g, &o), 0);
  for (int round = 0; round < 3; round++) {
    size_t before = g->n;
    for (uint64_t k = 0; k < 5000; k++)
      cr_assert_eq(tko_coalescer_mark(c, k << 20, k + (uint64_t)round), 0);
    cr_assert_eq(tko_coalescer_flush(c), 0);
    cr_assert_eq(g->n - before, 5000);
    for (size_t i = 0; i < 5000; i++) {
      cr_assert_eq(g->e[before + i].key, (uint64_t)i << 20);
      cr_assert_eq(g->e[before + i].value, i + (uint64_t)round);
    }
  }
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  tko_pool_destroy(p);
  log_free(g);
}

/* An allocator that counts the bytes it has handed out and not taken back. */
typedef struct byte_count {
  atomic_long live;
  tko_allocator al;
} byte_count;

static void *bc_alloc(void *ctx, size_t n) {
  size_t *p = malloc(n + 16);
  if (!p) return NULL;
  *p = n;
  atomic_fetch_add(&((byte_count *)ctx)->live, (long)n);
  return (char *)p + 16;
}

static void bc_free(void *ctx, void *ptr) {
  if (!ptr) return;
  size_t *p = (size_t *)((char *)ptr - 16);
  atomic_fetch_sub(&((byte_count *)ctx)->live, (long)*p);
  free(p);
}

static void *bc_realloc(void *ctx, void *ptr, size_t n) {
  void *q = bc_alloc(ctx, n);
  if (q && ptr) {
    size_t old = *(size_t *)((char *)ptr - 16);
    memcpy(q, ptr, old < n ? old : n);
    bc_free(ctx, ptr);
  }
  return q;
}

/* Waits, observing, until the count is at most limit; false after ~20 s. */
static bool bc_wait_leq(byte_count *b, long limit) {
  struct timespec now, end;
  clock_gettime(CLOCK_MONOTONIC, &end);
  end.tv_sec += 20;
  while (atomic_load(&b->live) > limit) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec > end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec > end.tv_nsec))
      return false;
    sched_yield();
  }
  return true;
}

/* Memory goes back after a burst (issue 14, defect 18): 20,000 keys grow
 * the tables to hundreds of KiB; once the ticks have found nothing dirty for
 * a second, both shrink back to initial_keys, exactly the bytes held at
 * create, and the coalescer still works. */
static void shrink_back_after_a_burst(unsigned interval_ms) {
  byte_count b = {.live = 0};
  b.al = (tko_allocator){bc_alloc, bc_realloc, bc_free, &b};
  tko_pool *p = make_pool(1);
  flush_log *g = log_new();
  tko_coalesce_options o = {.allocator = &b.al};
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, p, interval_ms, log_flush, g, &o), 0);
  long at_create = atomic_load(&b.live);
  enum { KEYS = 20000 };
  /* Paused, the pool holds the first tick's sweep task, so no sweep empties
   * the set while it grows (a slow build would otherwise sweep midway). */
  cr_assert_eq(tko_pool_pause(p), 0);
  for (uint64_t k = 0; k < KEYS; k++) cr_assert_eq(tko_coalescer_mark(c, k, k), 0);
  long peak = atomic_load(&b.live);
  cr_assert_gt(peak, at_create + KEYS * (long)sizeof(tko_coalesce_entry));
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_coalescer_flush(c), 0);
  cr_assert(bc_wait_leq(&b, at_create), "%ld bytes still held (%ld at create, %ld at the peak)",
            atomic_load(&b.live), at_create, peak);
  cr_assert_eq(atomic_load(&b.live), at_create);
  cr_assert_eq(tko_coalescer_mark(c, 7, 8), 0);
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  cr_assert_eq(atomic_load(&b.live), 0);
  tko_pool_destroy(p);
  log_free(g);
}

Test(coalescer, tables_shrink_back_after_a_burst) { shrink_back_after_a_burst(1); }

/* With an interval of a second or more, the first tick that finds nothing
 * dirty gives the memory back. */
Test(coalescer, tables_shrink_back_after_a_burst_at_one_idle_tick_of_a_long_interval) {
  shrink_back_after_a_burst(1000);
}

Test(coalescer, reentrant_calls_from_flush_fn) {
  tko_pool *p = make_pool(1);
  flush_log *g = log_new();
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, p, 0, log_flush, g, NULL), 0);
  g->c = c;
  g->mark_in_flush = 1;
  cr_assert_eq(tko_coalescer_mark(c, 1, 1), 0);
  cr_assert_eq(tko_coalescer_flush(c), 0);
  cr_assert_eq(g->flush_rc, -EDEADLK);
  cr_assert_eq(g->close_rc, -EDEADLK);
  cr_assert_eq(g->destroy_rc, -EDEADLK);
  cr_assert_eq(g->sweeps, 1);
  cr_assert_eq(tko_coalescer_flush(c), 0); /* the mark made inside the first sweep */
  cr_assert_eq(g->sweeps, 2);
  cr_assert_eq(g->e[1].key, 999);
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  tko_pool_destroy(p);
  log_free(g);
}

/* ---- concurrent marks, timer sweeps and on-demand flushes ------------------ */

#define CM_THREADS 6
#define CM_KEYS 64 /* per thread */

typedef struct cm_ctx {
  tko_coalescer *c;
  long rounds;
  /* Touched only by flush_fn (sweeps are serialized). */
  uint64_t last[CM_THREADS * CM_KEYS];
  long stamp[CM_THREADS * CM_KEYS];
  long sweep_no;
  long dup_in_sweep, went_back, bad_key;
  atomic_long mark_errors;
} cm_ctx;

static void cm_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  cm_ctx *m = user;
  long s = ++m->sweep_no;
  for (size_t i = 0; i < n; i++) {
    if (e[i].key >= CM_THREADS * CM_KEYS) {
      m->bad_key++;
      continue;
    }
    if (m->stamp[e[i].key] == s) m->dup_in_sweep++;
    m->stamp[e[i].key] = s;
    if (e[i].value < m->last[e[i].key]) m->went_back++;
    m->last[e[i].key] = e[i].value;
  }
}

typedef struct cm_thread {
  cm_ctx *m;
  unsigned t;
} cm_thread;

static void *cm_marker(void *arg) {
  cm_thread *th = arg;
  for (long r = 1; r <= th->m->rounds; r++)
    for (unsigned k = 0; k < CM_KEYS; k++)
      if (tko_coalescer_mark(th->m->c, th->t * CM_KEYS + k, (uint64_t)r))
        atomic_fetch_add(&th->m->mark_errors, 1);
  return NULL;
}

Test(coalescer, every_mark_reflected_under_concurrency) {
  tko_pool *p = make_pool(2);
  cm_ctx *m = calloc(1, sizeof *m);
  m->rounds = TT_SCALE(3000, 300);
  /* A 1 ms interval: many timer sweeps race with marks and flushes. */
  cr_assert_eq(tko_coalescer_create(&m->c, p, 1, cm_flush, m, NULL), 0);
  pthread_t th[CM_THREADS];
  cm_thread args[CM_THREADS];
  for (unsigned t = 0; t < CM_THREADS; t++) {
    args[t] = (cm_thread){m, t};
    cr_assert_eq(pthread_create(&th[t], NULL, cm_marker, &args[t]), 0);
  }
  for (int i = 0; i < 50; i++)
    cr_assert_eq(tko_coalescer_flush(m->c), 0);
  for (unsigned t = 0; t < CM_THREADS; t++)
    pthread_join(th[t], NULL);
  cr_assert_eq(tko_coalescer_close(m->c), 0); /* the final flush */
  cr_assert_eq(atomic_load(&m->mark_errors), 0);
  cr_assert_eq(m->dup_in_sweep, 0);
  cr_assert_eq(m->went_back, 0);
  cr_assert_eq(m->bad_key, 0);
  for (unsigned k = 0; k < CM_THREADS * CM_KEYS; k++)
    cr_assert_eq(m->last[k], (uint64_t)m->rounds);
  tko_coalesce_stats st;
  tko_coalescer_stats(m->c, &st);
  cr_assert_eq(st.marks, (uint64_t)(CM_THREADS * CM_KEYS * m->rounds));
  cr_assert_geq(st.sweeps, 1); /* how many depends on timing */
  cr_assert_eq(st.dirty, 0);
  cr_assert_eq(tko_coalescer_mark(m->c, 1, 1), -ESHUTDOWN);
  cr_assert_eq(tko_coalescer_destroy(m->c), 0);
  tko_pool_destroy(p);
  free(m);
}

/* ---- marks racing with close ----------------------------------------------- */

#define RC_THREADS 4
#define RC_KEYS 16

typedef struct rc_ctx {
  tko_coalescer *c;
  uint64_t flushed[RC_THREADS * RC_KEYS];  /* latest flushed value, by flush_fn */
  uint64_t accepted[RC_THREADS * RC_KEYS]; /* latest accepted, by the owner thread */
  atomic_long rejected_after_accept_stop, other_errors;
  tt_count started;
} rc_ctx;

static void rc_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  rc_ctx *r = user;
  for (size_t i = 0; i < n; i++)
    r->flushed[e[i].key] = e[i].value;
}

typedef struct rc_thread {
  rc_ctx *r;
  unsigned t;
} rc_thread;

static void *rc_marker(void *arg) {
  rc_thread *th = arg;
  rc_ctx *r = th->r;
  for (uint64_t v = 1;; v++) {
    unsigned key = th->t * RC_KEYS + (unsigned)(v % RC_KEYS);
    int rc = tko_coalescer_mark(r->c, key, v);
    if (rc == -ESHUTDOWN) break;
    if (rc) {
      atomic_fetch_add(&r->other_errors, 1);
      break;
    }
    r->accepted[key] = v;
    if (v == 100) tt_count_add(&r->started, 1);
  }
  /* Once rejected, always rejected. */
  if (tko_coalescer_mark(r->c, th->t * RC_KEYS, 1) != -ESHUTDOWN)
    atomic_fetch_add(&r->rejected_after_accept_stop, 1);
  return NULL;
}

Test(coalescer, marks_racing_with_close_are_flushed_or_rejected) {
  for (int iter = 0; iter < TT_SCALE(20, 5); iter++) {
    tko_pool *p = make_pool(2);
    rc_ctx *r = calloc(1, sizeof *r);
    tt_count_init(&r->started);
    cr_assert_eq(tko_coalescer_create(&r->c, p, 1, rc_flush, r, NULL), 0);
    pthread_t th[RC_THREADS];
    rc_thread args[RC_THREADS];
    for (unsigned t = 0; t < RC_THREADS; t++) {
      args[t] = (rc_thread){r, t};
      cr_assert_eq(pthread_create(&th[t], NULL, rc_marker, &args[t]), 0);
    }
    cr_assert(tt_count_wait_geq(&r->started, RC_THREADS)); /* all are marking */
    cr_assert_eq(tko_coalescer_close(r->c), 0);
    for (unsigned t = 0; t < RC_THREADS; t++)
      pthread_join(th[t], NULL);
    cr_assert_eq(atomic_load(&r->other_errors), 0);
    cr_assert_eq(atomic_load(&r->rejected_after_accept_stop), 0);
    for (unsigned k = 0; k < RC_THREADS * RC_KEYS; k++)
      cr_assert_eq(r->flushed[k], r->accepted[k]);
    tko_coalesce_stats st;
    tko_coalescer_stats(r->c, &st);
    cr_assert_geq(st.rejected, 2 * RC_THREADS);
    cr_assert_eq(st.dirty, 0);
    cr_assert_eq(tko_coalescer_destroy(r->c), 0);
    tko_pool_destroy(p);
    tt_count_fini(&r->started);
    free(r);
  }
}

Test(coalescer, destroy_runs_the_final_flush) {
  tko_pool *p = make_pool(1);
  flush_log *g = log_new();
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, p, TKO_MAX_COALESCE_INTERVAL_MS, log_flush, g, NULL), 0);
  for (uint64_t k = 0; k < 10; k++)
    cr_assert_eq(tko_coalescer_mark(c, k, k * 2), 0);
  cr_assert_eq(g->sweeps, 0);
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  cr_assert_eq(g->sweeps, 1);
  cr_assert_eq(g->n, 10);
  for (uint64_t k = 0; k < 10; k++)
    cr_assert_eq(g->e[k].value, k * 2);
  cr_assert(pthread_equal(g->last_thread, pthread_self()));
  tko_pool_destroy(p);
  log_free(g);
}

typedef struct close_race {
  tko_coalescer *c;
  atomic_int rc;
} close_race;

static void *closer(void *arg) {
  close_race *cr = arg;
  atomic_store(&cr->rc, tko_coalescer_close(cr->c));
  return NULL;
}

Test(coalescer, concurrent_closes_flush_once) {
  tko_pool *p = make_pool(1);
  flush_log *g = log_new();
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, p, 1000, log_flush, g, NULL), 0);
  cr_assert_eq(tko_coalescer_mark(c, 5, 5), 0);
  close_race a = {c, 1}, b = {c, 1};
  pthread_t ta, tb;
  cr_assert_eq(pthread_create(&ta, NULL, closer, &a), 0);
  cr_assert_eq(pthread_create(&tb, NULL, closer, &b), 0);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  cr_assert_eq(atomic_load(&a.rc), 0);
  cr_assert_eq(atomic_load(&b.rc), 0);
  cr_assert_eq(g->n, 1);
  cr_assert_eq(tko_coalescer_close(c), 0);
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  cr_assert_eq(g->n, 1);
  tko_pool_destroy(p);
  log_free(g);
}

Test(coalescer, timer_sweeps_itself_when_the_pool_refuses) {
  tko_pool *p = make_pool(1);
  flush_log *g = log_new();
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, p, 1, log_flush, g, NULL), 0);
  cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  /* A coalescer holds its pool: it cannot be made on one shut down. */
  tko_coalescer *late;
  cr_assert_eq(tko_coalescer_create(&late, p, 1, log_flush, g, NULL), -ESHUTDOWN);
  cr_assert_eq(tko_coalescer_mark(c, 77, 1), 0);
  cr_assert(tt_count_wait_geq(&g->flushed, 1)); /* the timer thread flushed it */
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  cr_assert_eq(g->n, 1);
  cr_assert_eq(g->e[0].key, 77);
  cr_assert_eq(g->sweeps, 1);
  cr_assert_not(pthread_equal(g->last_thread, pthread_self()));
  tko_pool_destroy(p);
  log_free(g);
}

/* ---- a sweep task dropped by TKO_CANCEL ------------------------------------ */

/* The only worker is pinned by a task that blocks until released, so the
 * sweep task stays queued (tko_pool_pause would do, but these tests need
 * not depend on its promise). The pool's on_cancel releases it: shutdown
 * waits for running tasks. */
typedef struct drop_ctx {
  bool forward;
  atomic_long forwarded, ignored;
  tt_count started, released;
} drop_ctx;

static int pin_task(void *arg) {
  drop_ctx *d = arg;
  tt_count_add(&d->started, 1);
  tt_count_wait_geq(&d->released, 1);
  return 0;
}

static void drop_on_cancel(void *user, const tko_task_info *t) {
  drop_ctx *d = user;
  tt_count_add(&d->released, 1);
  if (d->forward && tko_coalescer_pool_cancelled(t))
    atomic_fetch_add(&d->forwarded, 1);
  else
    atomic_fetch_add(&d->ignored, 1);
}

static void dropped_sweep_case(bool forward) {
  drop_ctx d = {.forward = forward};
  tt_count_init(&d.started);
  tt_count_init(&d.released);
  tko_options po = tko_basic_options(1);
  po.hooks.user = &d;
  po.hooks.on_cancel = drop_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &po), 0);
  cr_assert_eq(tko_submit(p, pin_task, &d, 0), 0);
  cr_assert(tt_count_wait_geq(&d.started, 1));
  flush_log *g = log_new();
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, p, 1, log_flush, g, NULL), 0);
  cr_assert_eq(tko_coalescer_mark(c, 5, 50), 0);
  /* The timer's submit has no hook to wait on; a tick skipped because a
   * sweep is already queued (the worker is pinned) is the observable sign
   * that the sweep task sits in the pool. Yield, with a hang deadline. */
  uint64_t t0 = (uint64_t)time(NULL);
  tko_coalesce_stats st;
  for (;;) {
    tko_coalescer_stats(c, &st);
    if (st.skipped_ticks > 0) break;
    cr_assert_lt((uint64_t)time(NULL) - t0, (uint64_t)(TT_LONG_MS / 1000));
    sched_yield();
  }
  /* The pool cancels the queued sweep itself and never shows it to the
   * host's hook; a host task queued behind it is what the hook sees (and
   * what releases the pinned worker so the shutdown can finish). */
  cr_assert_eq(tko_submit(p, pin_task, &d, 0), 0);
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  cr_assert_eq(atomic_load(&d.forwarded) + atomic_load(&d.ignored), 1);
  cr_assert_eq(atomic_load(&d.forwarded), 0); /* the host's task is not a sweep */
  /* The key is flushed exactly once: by a later tick on the timer thread
   * (the pool refuses the next sweep task) or by the final flush; destroy
   * does not wait for the dropped task. */
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  cr_assert_eq(g->n, 1);
  cr_assert_eq(g->e[0].value, 50);
  tko_pool_destroy(p);
  log_free(g);
  tt_count_fini(&d.started);
  tt_count_fini(&d.released);
}

Test(coalescer, sweep_dropped_by_pool_cancel_forwarded) {
  dropped_sweep_case(true);
}

Test(coalescer, sweep_dropped_by_pool_cancel_noticed_without_forwarding) {
  dropped_sweep_case(false);
}

static int destroy_task(void *arg) {
  tko_coalescer *c = arg;
  return tko_coalescer_destroy(c) == -EDEADLK ? 0 : 1;
}

Test(coalescer, destroy_from_a_pool_task_is_edeadlk) {
  tko_pool *p = make_pool(1);
  flush_log *g = log_new();
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, p, 0, log_flush, g, NULL), 0);
  cr_assert_eq(tko_submit(p, destroy_task, c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tko_stats ps;
  tko_pool_stats(p, &ps);
  cr_assert_eq(ps.failed, 0);
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  tko_pool_destroy(p);
  log_free(g);
}
