/* SPDX-License-Identifier: MIT */
/* Attack scenes for the extensions (coalescer, completion queue, lane
 * tables) through the public API only: callbacks that call back into their
 * own object or shut the pool down, close/cancel/flush racing many
 * submitters, a paused pool holding a queued sweep, pool destroy with
 * objects attached, failing allocators, extreme options, pthread_exit from a
 * lane task, elastic and resized pools under the extensions, and forked
 * children. Every scene runs under a watchdog that aborts with the scene's
 * name rather than hang; tasks and callbacks record, the test thread checks. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <poll.h>
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
#include <taskorch/coalescer.h>
#include <taskorch/completion.h>
#include <taskorch/lanes.h>

#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

#if defined(__SANITIZE_THREAD__)
#define AX_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define AX_TSAN 1
#endif
#endif

/* ---- watchdog ----------------------------------------------------------------- */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stop;
  const char *what;
  pthread_t th;
} wd = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, NULL, 0};

static void *wd_main(void *arg) {
  (void)arg;
  struct timespec dl;
  tt_deadline(&dl, TT_LONG_MS);
  pthread_mutex_lock(&wd.mu);
  while (!wd.stop)
    if (pthread_cond_timedwait(&wd.cv, &wd.mu, &dl) == ETIMEDOUT && !wd.stop) {
      fprintf(stderr, "WATCHDOG: scene %s hangs (pid %d)\n", wd.what, (int)getpid());
      if (getenv("TKO_ATTACK_GDB")) { /* a backtrace of every thread, for the report */
        char cmd[128];
        snprintf(cmd, sizeof cmd, "gdb -p %d -batch -ex 'thread apply all bt' 1>&2", (int)getpid());
        if (system(cmd) != 0) fprintf(stderr, "WATCHDOG: gdb failed\n");
      }
      abort();
    }
  pthread_mutex_unlock(&wd.mu);
  return NULL;
}

static void wd_start(const char *what) {
  wd.stop = false;
  wd.what = what;
  cr_assert_eq(pthread_create(&wd.th, NULL, wd_main, NULL), 0);
}

static void wd_stop(void) {
  pthread_mutex_lock(&wd.mu);
  wd.stop = true;
  pthread_cond_broadcast(&wd.cv);
  pthread_mutex_unlock(&wd.mu);
  pthread_join(wd.th, NULL);
}

static tko_pool *make_pool(unsigned workers) {
  tko_pool *p = NULL;
  tko_options o = tko_basic_options(workers);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  return p;
}

/* ==== coalescer ==================================================================== */

#define NK 64

static uint64_t key_of(unsigned i) {
  switch (i) {
  case 0: return 0;
  case 1: return UINT64_MAX;
  case 2: return UINT64_MAX - 1;
  default: return ((uint64_t)i << 48) | ((uint64_t)i << 20); /* spread in high bits */
  }
}

static int index_of(uint64_t key) {
  for (unsigned i = 0; i < NK; i++)
    if (key_of(i) == key) return (int)i;
  return -1;
}

/* What every flush call saw; callbacks may run on any thread, one at a time
 * per coalescer (sweeps never overlap), but we lock anyway to see overlaps. */
typedef struct crec {
  pthread_mutex_t mu;
  tko_coalescer *c;
  tko_pool *pool;
  atomic_int in_flush, overlap;
  long calls, entries, bad_key, dup_in_sweep, went_back, zero_count;
  uint64_t last[NK];
  bool seen[NK];
  long stamp[NK];
  tt_count flushed; /* entries */
  /* re-entry probing */
  atomic_int probe;
  atomic_int rc_flush, rc_close, rc_destroy, rc_mark, rc_pwait, rc_pdestroy;
  atomic_int probes_done;
  tt_count probes;
  uint64_t mark_key;
  atomic_int mark_accepted_in_flush;
  /* blocking */
  _Atomic(tt_gate *) block;
  tt_count blocked;
} crec;

static void crec_init(crec *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  tt_count_init(&r->flushed);
  tt_count_init(&r->blocked);
  tt_count_init(&r->probes);
}

static void crec_flush(void *user, const tko_coalesce_entry *e, size_t n) {
  crec *r = user;
  if (atomic_fetch_add(&r->in_flush, 1) != 0) atomic_store(&r->overlap, 1);
  tt_gate *block = atomic_load(&r->block);
  if (block) {
    tt_count_add(&r->blocked, 1);
    tt_gate_wait(block);
  }
  pthread_mutex_lock(&r->mu);
  long s = ++r->calls;
  if (n == 0) r->zero_count++;
  for (size_t i = 0; i < n; i++) {
    int k = index_of(e[i].key);
    if (k < 0) {
      r->bad_key++;
      continue;
    }
    if (r->stamp[k] == s) r->dup_in_sweep++;
    r->stamp[k] = s;
    if (r->seen[k] && e[i].value <= r->last[k]) r->went_back++;
    r->last[k] = e[i].value;
    r->seen[k] = true;
  }
  r->entries += (long)n;
  pthread_mutex_unlock(&r->mu);
  if (atomic_exchange(&r->probe, 0)) {
    atomic_store(&r->rc_flush, tko_coalescer_flush(r->c));
    atomic_store(&r->rc_close, tko_coalescer_close(r->c));
    atomic_store(&r->rc_destroy, tko_coalescer_destroy(r->c));
    int m = tko_coalescer_mark(r->c, r->mark_key, 7);
    atomic_store(&r->rc_mark, m);
    if (m == 0) atomic_fetch_add(&r->mark_accepted_in_flush, 1);
    if (r->pool) {
      atomic_store(&r->rc_pwait, tko_pool_wait_idle(r->pool, 0));
      atomic_store(&r->rc_pdestroy, tko_pool_destroy(r->pool));
    }
    atomic_fetch_add(&r->probes_done, 1);
    tt_count_add(&r->probes, 1);
  }
  atomic_fetch_sub(&r->in_flush, 1);
  tt_count_add(&r->flushed, (long)n);
}

static bool crec_saw(crec *r, uint64_t key, uint64_t atleast) {
  int k = index_of(key);
  pthread_mutex_lock(&r->mu);
  bool ok = k >= 0 && r->seen[k] && r->last[k] >= atleast;
  pthread_mutex_unlock(&r->mu);
  return ok;
}

static void crec_check(crec *r) {
  cr_assert_eq(atomic_load(&r->overlap), 0, "two sweeps overlapped");
  cr_assert_eq(r->bad_key, 0);
  cr_assert_eq(r->dup_in_sweep, 0, "a key twice in one sweep");
  cr_assert_eq(r->went_back, 0, "a key's flushed value went back or repeated");
  cr_assert_eq(r->zero_count, 0, "flush_fn called with count 0");
}

/* flush_fn calls flush, close, destroy (-EDEADLK each), mark and, on a
 * worker, the pool's wait and destroy (-EDEADLK), in every context a sweep
 * runs in: a worker (timer tick), tko_coalescer_flush, the timer thread after
 * the pool's shutdown, and close's final flush. A mark that flush_fn's call
 * got accepted must reach a later sweep. */
static void reentry_probe_wait(crec *r, int before) {
  cr_assert(tt_count_wait_geq(&r->probes, before + 1), "the probe never ran");
}

Test(attack_ext, coalescer_flush_fn_reenters_in_every_context) {
  wd_start("coalescer_flush_fn_reenters_in_every_context");
  static crec r;
  crec_init(&r);
  tko_pool *p = make_pool(1);
  cr_assert_eq(tko_coalescer_create(&r.c, p, 1, crec_flush, &r, NULL), 0);

  /* 1: a timer tick's sweep on the worker. */
  r.pool = p;
  r.mark_key = key_of(10);
  atomic_store(&r.probe, 1);
  cr_assert_eq(tko_coalescer_mark(r.c, key_of(3), 1), 0);
  reentry_probe_wait(&r, 0);
  cr_assert_eq(atomic_load(&r.rc_flush), -EDEADLK);
  cr_assert_eq(atomic_load(&r.rc_close), -EDEADLK);
  cr_assert_eq(atomic_load(&r.rc_destroy), -EDEADLK);
  cr_assert_eq(atomic_load(&r.rc_mark), 0);
  int pw = atomic_load(&r.rc_pwait), pd = atomic_load(&r.rc_pdestroy);
  /* The sweep ran on a worker, so the pool's calls are -EDEADLK (unless the
   * tick swept on the timer thread, which the pool does not own). */
  cr_assert(pw == -EDEADLK || pw == 0 || pw == -ETIMEDOUT, "wait_idle from flush_fn: %d", pw);
  cr_assert(pd == -EDEADLK || pd == -EBUSY, "pool destroy from flush_fn: %d", pd);
  bool pool_shut = pd == -EBUSY;
  cr_assert_eq(tko_coalescer_flush(r.c), 0);
  cr_assert(crec_saw(&r, key_of(10), 7), "a mark flush_fn got accepted was lost");

  /* 2: tko_coalescer_flush on this thread. */
  r.pool = NULL;
  r.mark_key = key_of(11);
  atomic_store(&r.probe, 1);
  cr_assert_eq(tko_coalescer_mark(r.c, key_of(4), 1), 0);
  cr_assert_eq(tko_coalescer_flush(r.c), 0);
  cr_assert_eq(atomic_load(&r.probes_done), 2);
  cr_assert_eq(atomic_load(&r.rc_flush), -EDEADLK);
  cr_assert_eq(atomic_load(&r.rc_close), -EDEADLK);
  cr_assert_eq(atomic_load(&r.rc_destroy), -EDEADLK);
  cr_assert_eq(atomic_load(&r.rc_mark), 0);
  cr_assert_eq(tko_coalescer_flush(r.c), 0);
  cr_assert(crec_saw(&r, key_of(11), 7));

  /* 3: the pool is shut down: the timer thread sweeps itself. */
  if (!pool_shut) cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  r.mark_key = key_of(12);
  long before = tt_count_get(&r.flushed);
  atomic_store(&r.probe, 1);
  cr_assert_eq(tko_coalescer_mark(r.c, key_of(5), 1), 0);
  cr_assert(tt_count_wait_geq(&r.flushed, before + 1), "no sweep after the pool's shutdown");
  reentry_probe_wait(&r, 2);
  cr_assert_eq(atomic_load(&r.rc_flush), -EDEADLK);
  cr_assert_eq(atomic_load(&r.rc_close), -EDEADLK);
  cr_assert_eq(atomic_load(&r.rc_destroy), -EDEADLK);
  cr_assert_eq(atomic_load(&r.rc_mark), 0);
  cr_assert_eq(tko_coalescer_flush(r.c), 0);
  cr_assert(crec_saw(&r, key_of(12), 7));

  /* 4: close's final flush: a mark from inside it is flushed or rejected. */
  r.mark_key = key_of(13);
  atomic_store(&r.probe, 1);
  cr_assert_eq(tko_coalescer_mark(r.c, key_of(6), 1), 0);
  cr_assert_eq(tko_coalescer_close(r.c), 0);
  cr_assert_eq(atomic_load(&r.probes_done), 4);
  cr_assert_eq(atomic_load(&r.rc_flush), -EDEADLK);
  cr_assert_eq(atomic_load(&r.rc_close), -EDEADLK);
  cr_assert_eq(atomic_load(&r.rc_destroy), -EDEADLK);
  int m = atomic_load(&r.rc_mark);
  cr_assert(m == 0 || m == -ESHUTDOWN, "mark in the final flush: %d", m);
  cr_assert_eq(tko_coalescer_close(r.c), 0);
  if (m == 0) cr_assert(crec_saw(&r, key_of(13), 7), "a mark accepted during the final flush was lost");
  cr_assert_eq(tko_coalescer_mark(r.c, 1, 1), -ESHUTDOWN);
  tko_coalesce_stats s;
  tko_coalescer_stats(r.c, &s);
  cr_assert_eq(s.dirty, 0);
  cr_assert_eq(s.flushed, (uint64_t)r.entries);
  cr_assert_eq(s.marks, 7 + (m == 0));
  crec_check(&r);
  cr_assert_eq(tko_pool_destroy(p), -EBUSY);
  cr_assert_eq(tko_coalescer_destroy(r.c), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  wd_stop();
}

/* A sweep blocks in flush_fn on a worker; a mark made after it took its keys
 * and a flush called after that mark: the flush must wait for the running
 * sweep and then pass the new value. Close from a third thread waits too. */
static int do_flush(void *arg) { return tko_coalescer_flush(arg); }
static int do_close(void *arg) { return tko_coalescer_close(arg); }
static int do_cdestroy(void *arg) { return tko_coalescer_destroy(arg); }

Test(attack_ext, coalescer_flush_waits_for_a_blocked_sweep_then_passes_the_new_value) {
  wd_start("coalescer_flush_waits_for_a_blocked_sweep_then_passes_the_new_value");
  static crec r;
  crec_init(&r);
  static tt_gate g;
  g = (tt_gate)TT_GATE_INIT;
  tko_pool *p = make_pool(2);
  cr_assert_eq(tko_coalescer_create(&r.c, p, 1, crec_flush, &r, NULL), 0);
  atomic_store(&r.block, &g);
  cr_assert_eq(tko_coalescer_mark(r.c, key_of(0), 1), 0);
  cr_assert(tt_count_wait_geq(&r.blocked, 1)); /* a sweep holds key 0 = 1 */
  cr_assert_eq(tko_coalescer_mark(r.c, key_of(0), 2), 0);
  cr_assert_eq(tko_coalescer_mark(r.c, key_of(1), 5), 0);
  tf_thread f, cl;
  cr_assert_eq(tf_thread_start(&f, do_flush, r.c), 0);
  cr_assert(tf_wait_thread_sleeping(f.tid));
  cr_assert_not(tf_thread_is_done(&f), "flush returned while a sweep of its keys runs");
  cr_assert_eq(tf_thread_start(&cl, do_close, r.c), 0);
  atomic_store(&r.block, (tt_gate *)NULL); /* later sweeps do not block (the one blocked has read it) */
  tt_gate_open(&g);
  int rc = 1;
  cr_assert(tf_thread_join(&f, &rc));
  cr_assert(rc == 0, "flush rc %d", rc);
  /* flush returned: every mark before it has been passed. */
  cr_assert(crec_saw(&r, key_of(0), 2), "flush returned before the new value was passed");
  cr_assert(crec_saw(&r, key_of(1), 5));
  cr_assert(tf_thread_join(&cl, &rc));
  cr_assert_eq(rc, 0);
  crec_check(&r);
  cr_assert_eq(tko_coalescer_destroy(r.c), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  wd_stop();
}

/* A paused pool holds a queued sweep task: flush must not wait for it,
 * destroy takes it back (the pool counts it cancelled, its on_cancel hook
 * never sees it). */
static atomic_int pool_cancels;
static void count_pool_cancel(void *u, const tko_task_info *t) {
  (void)u;
  (void)t;
  atomic_fetch_add(&pool_cancels, 1);
}

static bool queued_geq1(const tko_stats *s) { return s->queued >= 1; }

Test(attack_ext, coalescer_on_a_paused_pool_with_a_queued_sweep) {
  wd_start("coalescer_on_a_paused_pool_with_a_queued_sweep");
  atomic_store(&pool_cancels, 0);
  static crec r;
  crec_init(&r);
  tko_options o = tko_basic_options(1);
  o.hooks.on_cancel = count_pool_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_coalescer_create(&r.c, p, 1, crec_flush, &r, NULL), 0);
  cr_assert_eq(tko_coalescer_mark(r.c, key_of(0), 1), 0);
  tko_stats ps;
  cr_assert(tf_stats_wait(p, &ps, queued_geq1), "no sweep task queued");
  tf_thread f;
  cr_assert_eq(tf_thread_start(&f, do_flush, r.c), 0);
  int rc = 1;
  cr_assert(tf_thread_join_within(&f, 20000, &rc), "flush waits for a sweep a paused pool holds");
  cr_assert_eq(rc, 0);
  cr_assert(crec_saw(&r, key_of(0), 1));
  /* Another mark: the tick finds the queued sweep (skipped) or queues one. */
  cr_assert_eq(tko_coalescer_mark(r.c, key_of(1), 1), 0);
  tf_thread d;
  cr_assert_eq(tf_thread_start(&d, do_cdestroy, r.c), 0);
  cr_assert(tf_thread_join_within(&d, 20000, &rc), "destroy held by a paused pool");
  cr_assert_eq(rc, 0);
  cr_assert(crec_saw(&r, key_of(1), 1));
  crec_check(&r);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tko_pool_stats(p, &ps);
  cr_assert_eq(ps.submitted, ps.completed + ps.cancelled);
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  cr_assert_eq(atomic_load(&pool_cancels), 0, "the pool's on_cancel saw a sweep task");
  cr_assert_eq(tko_pool_destroy(p), 0);
  wd_stop();
}

/* Many markers (each key owned by one thread, values rising), a flusher, a
 * resizer, the pool shut down (in each mode) midway, then close: per key the
 * flushed values rise and the last is the last accepted mark; counts agree.
 * The markers go on until the close refuses them, so that sweeps still come
 * after the shutdown however fast they ran before it. */
#define MK_THREADS 4
typedef struct mk_ctx {
  tko_coalescer *c;
  tko_pool *p;
  atomic_bool stop, stop_aux;
  atomic_long accepted, rejected, nomem, bad_rc;
  uint64_t last_accepted[NK]; /* written by the key's owner only */
  atomic_long resize_bad, flush_bad;
} mk_ctx;

typedef struct mk_thread {
  mk_ctx *m;
  unsigned t;
} mk_thread;

static void *mk_marker(void *arg) {
  mk_thread *th = arg;
  mk_ctx *m = th->m;
  uint64_t v = 0;
  bool closed = false;
  while (!closed) {
    v++;
    for (unsigned k = th->t; k < NK; k += MK_THREADS) {
      int rc = tko_coalescer_mark(m->c, key_of(k), v);
      if (rc == 0) {
        atomic_fetch_add(&m->accepted, 1);
        m->last_accepted[k] = v;
      } else if (rc == -ESHUTDOWN) {
        atomic_fetch_add(&m->rejected, 1);
        closed = true;
      } else if (rc == -ENOMEM) {
        atomic_fetch_add(&m->nomem, 1);
      } else {
        atomic_store(&m->bad_rc, rc);
      }
    }
  }
  return NULL;
}

static void *mk_flusher(void *arg) {
  mk_ctx *m = arg;
  while (!atomic_load(&m->stop_aux)) {
    int rc = tko_coalescer_flush(m->c);
    if (rc != 0) atomic_store(&m->flush_bad, rc);
    sched_yield();
  }
  return NULL;
}

static void *mk_resizer(void *arg) {
  mk_ctx *m = arg;
  unsigned i = 0;
  while (!atomic_load(&m->stop_aux)) {
    int rc = tko_pool_resize(m->p, 1 + (i % 3), i % 2);
    if (rc != 0 && rc != -ESHUTDOWN && rc != -EAGAIN) atomic_store(&m->resize_bad, rc);
    i++;
    sched_yield();
  }
  return NULL;
}

static void markers_scene(int mode, bool failing_alloc) {
  static crec r;
  crec_init(&r);
  static mk_ctx m;
  memset(&m, 0, sizeof m);
  static tfa fa;
  tfa_init(&fa);
  tko_options o = tko_elastic_options(2, 1, 5);
  o.max_threads = 8;
  cr_assert_eq(tko_pool_create(&m.p, &o), 0);
  tko_coalesce_options co = {.initial_keys = 1, .weight = INT_MAX, .allocator = &fa.al};
  cr_assert_eq(tko_coalescer_create(&r.c, m.p, 1, crec_flush, &r, &co), 0);
  m.c = r.c;
  if (failing_alloc) tfa_fail_every(&fa, 5); /* 3 in a row must be able to succeed: a growth takes several */
  pthread_t mt[MK_THREADS], ft, rt;
  static mk_thread th[MK_THREADS];
  for (unsigned i = 0; i < MK_THREADS; i++) {
    th[i] = (mk_thread){&m, i};
    cr_assert_eq(pthread_create(&mt[i], NULL, mk_marker, &th[i]), 0);
  }
  cr_assert_eq(pthread_create(&ft, NULL, mk_flusher, &m), 0);
  cr_assert_eq(pthread_create(&rt, NULL, mk_resizer, &m), 0);
  if (!tt_count_wait_geq_within(&r.flushed, 200, 30000)) {
    tko_coalesce_stats s;
    tko_coalescer_stats(r.c, &s);
    fprintf(stderr,
            "markers: flushed %ld entries in %ld calls; marks %ld accepted, %ld nomem; "
            "stats marks %llu flushed %llu sweeps %llu dirty %llu skipped %llu inline %llu; "
            "allocator calls %ld failures %ld live %ld\n",
            tt_count_get(&r.flushed), r.calls, atomic_load(&m.accepted), atomic_load(&m.nomem),
            (unsigned long long)s.marks, (unsigned long long)s.flushed, (unsigned long long)s.sweeps,
            (unsigned long long)s.dirty, (unsigned long long)s.skipped_ticks,
            (unsigned long long)s.inline_sweeps, atomic_load(&fa.calls), atomic_load(&fa.failures),
            atomic_load(&fa.live));
    cr_assert(0, "no sweep passed 200 entries before the pool's shutdown");
  }
  if (mode == 0) cr_assert_eq(tko_pool_shutdown(m.p, TKO_DRAIN), 0);
  if (mode == 1) cr_assert_eq(tko_pool_shutdown(m.p, TKO_CANCEL), 0);
  if (mode == 2) cr_assert_eq(tko_pool_shutdown(m.p, TKO_CANCEL_NOWAIT), 0);
  if (mode == 3) cr_assert_eq(tko_pool_destroy(m.p), -EBUSY);
  long now = tt_count_get(&r.flushed);
  cr_assert(tt_count_wait_geq_within(&r.flushed, now + 200, 30000), "no sweeps after the pool's shutdown");
  atomic_store(&m.stop_aux, true);
  pthread_join(ft, NULL);
  pthread_join(rt, NULL);
  cr_assert_eq(tko_coalescer_close(r.c), 0);
  for (unsigned i = 0; i < MK_THREADS; i++) pthread_join(mt[i], NULL);
  tfa_heal(&fa);
  cr_assert_eq(atomic_load(&m.bad_rc), 0, "mark rc %ld", atomic_load(&m.bad_rc));
  cr_assert_eq(atomic_load(&m.flush_bad), 0, "flush rc %ld", atomic_load(&m.flush_bad));
  cr_assert_eq(atomic_load(&m.resize_bad), 0, "resize rc %ld", atomic_load(&m.resize_bad));
  if (!failing_alloc) cr_assert_eq(atomic_load(&m.nomem), 0);
  crec_check(&r);
  for (unsigned k = 0; k < NK; k++) {
    if (!m.last_accepted[k]) continue;
    cr_assert(r.seen[k], "key %u never flushed", k);
    cr_assert_eq(r.last[k], m.last_accepted[k], "key %u: last flushed %llu, last accepted %llu", k,
                 (unsigned long long)r.last[k], (unsigned long long)m.last_accepted[k]);
  }
  tko_coalesce_stats s;
  tko_coalescer_stats(r.c, &s);
  cr_assert_eq(s.marks, (uint64_t)atomic_load(&m.accepted));
  cr_assert_eq(s.rejected, (uint64_t)atomic_load(&m.rejected));
  cr_assert_eq(s.flushed, (uint64_t)r.entries);
  cr_assert_eq(s.dirty, 0);
  cr_assert_leq(s.sweeps, (uint64_t)r.calls);
  cr_assert_eq(tko_coalescer_destroy(r.c), 0);
  cr_assert_eq(atomic_load(&fa.live), 0, "the coalescer leaked %ld blocks", atomic_load(&fa.live));
  cr_assert_eq(tko_pool_destroy(m.p), 0);
}

Test(attack_ext, coalescer_markers_meet_a_drain_shutdown_and_close) {
  wd_start("coalescer_markers_meet_a_drain_shutdown_and_close");
  markers_scene(0, false);
  wd_stop();
}
Test(attack_ext, coalescer_markers_meet_a_cancel_shutdown_and_close) {
  wd_start("coalescer_markers_meet_a_cancel_shutdown_and_close");
  markers_scene(1, false);
  wd_stop();
}
Test(attack_ext, coalescer_markers_meet_a_nowait_shutdown_failing_allocator) {
  wd_start("coalescer_markers_meet_a_nowait_shutdown_failing_allocator");
  markers_scene(2, true);
  wd_stop();
}
Test(attack_ext, coalescer_markers_meet_a_busy_pool_destroy_failing_allocator) {
  wd_start("coalescer_markers_meet_a_busy_pool_destroy_failing_allocator");
  markers_scene(3, true);
  wd_stop();
}

/* Create with an allocator that fails its Nth call, for every N until one
 * create needs no failure: -ENOMEM and nothing leaked, or a working
 * coalescer. */
static void nop_flush(void *u, const tko_coalesce_entry *e, size_t n) {
  (void)e;
  atomic_fetch_add((atomic_long *)u, (long)n);
}

Test(attack_ext, coalescer_create_and_marks_with_the_nth_allocation_failing) {
  wd_start("coalescer_create_and_marks_with_the_nth_allocation_failing");
  tko_pool *p = make_pool(1);
  static tfa fa;
  bool clean = false;
  for (long n = 1; n < 60 && !clean; n++) {
    tfa_init(&fa);
    tfa_fail_nth(&fa, n);
    static atomic_long got;
    atomic_store(&got, 0);
    tko_coalescer *c = NULL;
    tko_coalesce_options co = {.initial_keys = 2, .allocator = &fa.al};
    int rc = tko_coalescer_create(&c, p, n % 2, nop_flush, &got, &co);
    if (rc != 0) {
      cr_assert(rc == -ENOMEM || rc == -EAGAIN, "create rc %d", rc);
      cr_assert_eq(atomic_load(&fa.live), 0, "a failed create leaked (n=%ld)", n);
      continue;
    }
    long accepted = 0;
    for (unsigned k = 0; k < 300; k++) {
      int m = tko_coalescer_mark(c, (uint64_t)k * 0x9E3779B97F4A7C15ull, k);
      cr_assert(m == 0 || m == -ENOMEM, "mark rc %d", m);
      accepted += m == 0;
    }
    cr_assert_eq(tko_coalescer_destroy(c), 0);
    cr_assert_eq(atomic_load(&got), accepted, "n=%ld: %ld accepted, %ld flushed", n, accepted,
                 atomic_load(&got));
    cr_assert_eq(atomic_load(&fa.live), 0, "n=%ld leaked", n);
    clean = atomic_load(&fa.failures) == 0;
  }
  cr_assert(clean);
  cr_assert_eq(tko_pool_destroy(p), 0);
  wd_stop();
}

/* flush_fn (on the thread calling tko_coalescer_flush, or on a worker) shuts
 * the pool down or destroys it: no hang, a documented code. */
typedef struct shutter {
  tko_pool *p;
  int mode;
  atomic_int rc, calls;
} shutter;

static void shut_flush(void *u, const tko_coalesce_entry *e, size_t n) {
  (void)e;
  (void)n;
  shutter *s = u;
  if (atomic_fetch_add(&s->calls, 1) != 0) return;
  if (s->mode == 0) atomic_store(&s->rc, tko_pool_shutdown(s->p, TKO_DRAIN));
  if (s->mode == 1) atomic_store(&s->rc, tko_pool_shutdown(s->p, TKO_CANCEL_NOWAIT));
  if (s->mode == 2) atomic_store(&s->rc, tko_pool_destroy(s->p));
  if (s->mode == 3) atomic_store(&s->rc, tko_pool_shutdown_timed(s->p, TKO_CANCEL, 50));
}

static void flush_shuts_pool(int mode, bool on_worker) {
  static shutter s;
  memset(&s, 0, sizeof s);
  atomic_store(&s.rc, 1);
  s.mode = mode;
  s.p = make_pool(2);
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, s.p, on_worker ? 1 : 0, shut_flush, &s, NULL), 0);
  cr_assert_eq(tko_coalescer_mark(c, 1, 1), 0);
  if (!on_worker) {
    tf_thread f;
    cr_assert_eq(tf_thread_start(&f, do_flush, c), 0);
    int rc = 1;
    cr_assert(tf_thread_join_within(&f, 20000, &rc), "flush_fn's pool shutdown (mode %d) hangs", mode);
    cr_assert_eq(rc, 0);
  }
  uint64_t end = tt_now_ns() + 20000000000ull;
  while (atomic_load(&s.rc) == 1 && tt_now_ns() < end) sched_yield();
  int rc = atomic_load(&s.rc);
  if (on_worker)
    /* On a worker: -EDEADLK. (Swept on the timer thread, which the pool does
     * not own, when the pool refused the sweep: the call works.) */
    cr_assert(rc == -EDEADLK || (mode == 2 ? rc == -EBUSY : mode == 3 ? rc == 0 || rc == -ETIMEDOUT : rc == 0),
              "mode %d from flush_fn on a tick: %d", mode, rc);
  else if (mode == 2)
    cr_assert_eq(rc, -EBUSY, "pool destroy from flush_fn with the coalescer attached: %d", rc);
  else if (mode == 3)
    cr_assert(rc == 0 || rc == -ETIMEDOUT, "timed shutdown from flush_fn: %d", rc);
  else
    cr_assert_eq(rc, 0, "mode %d from flush_fn on its flushing thread: %d", mode, rc);
  cr_assert_eq(tko_coalescer_mark(c, 2, 2), 0);
  tf_thread d;
  cr_assert_eq(tf_thread_start(&d, do_cdestroy, c), 0);
  cr_assert(tf_thread_join_within(&d, 20000, &rc), "coalescer destroy hangs");
  cr_assert_eq(rc, 0);
  cr_assert_eq(tko_pool_destroy(s.p), 0);
}

Test(attack_ext, coalescer_flush_fn_shuts_its_pool_down) {
  wd_start("coalescer_flush_fn_shuts_its_pool_down");
  for (int mode = 0; mode < 4; mode++) flush_shuts_pool(mode, false);
  for (int mode = 0; mode < 4; mode++) flush_shuts_pool(mode, true);
  wd_stop();
}

/* Pool destroy with a coalescer and lanes attached: -EBUSY, pool shut down;
 * the extensions keep their documented behaviour until destroyed. */
Test(attack_ext, attached_objects_outlive_their_pools_shutdown) {
  wd_start("attached_objects_outlive_their_pools_shutdown");
  static crec r;
  crec_init(&r);
  tko_pool *p = make_pool(2);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  cr_assert_eq(tko_coalescer_create(&r.c, p, 1, crec_flush, &r, NULL), 0);
  tko_coalescer *c0, *cmax, *cbad = NULL;
  static atomic_long got0;
  atomic_store(&got0, 0);
  cr_assert_eq(tko_coalescer_create(&c0, p, 0, nop_flush, &got0, NULL), 0);
  cr_assert_eq(tko_coalescer_create(&cmax, p, TKO_MAX_COALESCE_INTERVAL_MS, nop_flush, &got0, NULL), 0);
  cr_assert_eq(tko_coalescer_create(&cbad, p, TKO_MAX_COALESCE_INTERVAL_MS + 1, nop_flush, &got0, NULL),
               -EINVAL);
  cr_assert_eq(tko_coalescer_create(&cbad, p, 1, NULL, NULL, NULL), -EINVAL);
  cr_assert_eq(tko_coalescer_create(NULL, p, 1, nop_flush, NULL, NULL), -EINVAL);
  cr_assert_eq(tko_coalescer_mark(c0, 5, 5), 0);
  cr_assert_eq(tko_coalescer_mark(cmax, 6, 6), 0);
  static atomic_int ran;
  atomic_store(&ran, 0);
  cr_assert_eq(tko_pool_destroy(p), -EBUSY);
  cr_assert_eq(tko_pool_destroy(p), -EBUSY);
  tko_lanes *l2;
  cr_assert_eq(tko_lanes_create(&l2, p, NULL), -ESHUTDOWN);
  cr_assert_eq(tko_coalescer_create(&cbad, p, 1, nop_flush, NULL, NULL), -ESHUTDOWN);
  cr_assert_eq(tko_lanes_submit(l, 1, tt_nop_fn, NULL, 0), -ESHUTDOWN);
  cr_assert_eq(tko_lanes_submit_wait(l, 1, tt_nop_fn, NULL, 0), -ESHUTDOWN);
  cr_assert_eq(tko_lanes_wait_idle(l, 0), 0);
  cr_assert_eq(tko_lanes_close(l), 0);
  cr_assert_eq(tko_lanes_cancel(l), 0);
  cr_assert_eq(tko_pool_resize(p, 2, 0), -ESHUTDOWN);
  /* The timer thread sweeps itself once the pool is shut down. */
  cr_assert_eq(tko_coalescer_mark(r.c, key_of(0), 9), 0);
  cr_assert(tt_count_wait_geq(&r.flushed, 1), "the coalescer stopped sweeping with its pool");
  cr_assert(crec_saw(&r, key_of(0), 9));
  cr_assert_eq(tko_coalescer_destroy(r.c), 0);
  cr_assert_eq(tko_coalescer_destroy(c0), 0);
  cr_assert_eq(tko_coalescer_destroy(cmax), 0);
  cr_assert_eq(atomic_load(&got0), 2);
  cr_assert_eq(tko_pool_destroy(p), -EBUSY, "lanes still attached");
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  crec_check(&r);
  wd_stop();
}

/* ==== lane tables ================================================================== */

typedef struct ltok {
  atomic_int runs, cancels;
  bool accepted;
  uint64_t key;
  long seq; /* per (submitter, key) */
  int submitter;
} ltok;

typedef struct lctx {
  tko_lanes *l;
  tko_pool *p;
  atomic_int inflight_lane0; /* lanes == 1: all tasks exclusive */
  atomic_int excl_broken;
  pthread_mutex_t mu;
  long last_seq[8][NK];
  atomic_long order_broken;
  atomic_long cancel_seen;
  /* reentry probes from a task / on_cancel */
  atomic_int probe_task, probe_cancel;
  atomic_int t_wait, t_destroy, t_pshut, t_pwait, t_submit, t_resize, t_cancel, t_submit_wait;
  atomic_int c_wait, c_destroy, c_submit, c_pshut, c_submit_wait;
  atomic_int probes_done, cprobes_done;
  bool one_lane;
  ltok *extra;
} lctx;

static lctx *g_lctx;

static int ltok_run(void *arg) {
  ltok *t = arg;
  lctx *c = g_lctx;
  if (c->one_lane && atomic_fetch_add(&c->inflight_lane0, 1) != 0) atomic_store(&c->excl_broken, 1);
  atomic_fetch_add(&t->runs, 1);
  int k = index_of(t->key);
  if (k >= 0 && t->submitter >= 0) {
    pthread_mutex_lock(&c->mu);
    if (t->seq <= c->last_seq[t->submitter][k]) atomic_fetch_add(&c->order_broken, 1);
    c->last_seq[t->submitter][k] = t->seq;
    pthread_mutex_unlock(&c->mu);
  }
  if (c->one_lane) atomic_fetch_sub(&c->inflight_lane0, 1);
  return 0;
}

static void ltok_cancel(void *user, const tko_lane_task *task) {
  lctx *c = user;
  ltok *t = task->arg;
  atomic_fetch_add(&t->cancels, 1);
  atomic_fetch_add(&c->cancel_seen, 1);
  if (atomic_exchange(&c->probe_cancel, 0)) {
    atomic_store(&c->c_wait, tko_lanes_wait_idle(c->l, -1));
    atomic_store(&c->c_destroy, tko_lanes_destroy(c->l));
    atomic_store(&c->c_submit, tko_lanes_submit(c->l, 1, tt_nop_fn, NULL, 0));
    atomic_store(&c->c_submit_wait, tko_lanes_submit_wait(c->l, 1, tt_nop_fn, NULL, 0));
    atomic_store(&c->c_pshut, tko_pool_shutdown_timed(c->p, TKO_DRAIN, 0));
    atomic_fetch_add(&c->cprobes_done, 1);
  }
}

static long ltok_bad(ltok *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int r = atomic_load(&t[i].runs), c = atomic_load(&t[i].cancels);
    if (t[i].accepted ? r + c != 1 : r + c != 0) return (long)i;
  }
  return -1;
}

/* A lane task calls back into its lanes and pool; then cancels its own
 * table, whose on_cancel calls back too. */
static int probing_task(void *arg) {
  lctx *c = g_lctx;
  ltok *t = arg;
  atomic_fetch_add(&t->runs, 1);
  atomic_store(&c->t_wait, tko_lanes_wait_idle(c->l, -1));
  atomic_store(&c->t_destroy, tko_lanes_destroy(c->l));
  atomic_store(&c->t_pshut, tko_pool_shutdown(c->p, TKO_CANCEL));
  atomic_store(&c->t_pwait, tko_pool_wait_idle(c->p, -1));
  atomic_store(&c->t_submit_wait, tko_lanes_submit_wait(c->l, t->key, tt_nop_fn, NULL, 0));
  c->extra->key = t->key;
  c->extra->submitter = -1;
  int rc = tko_lanes_submit(c->l, t->key, ltok_run, c->extra, 0);
  c->extra->accepted = rc == 0;
  atomic_store(&c->t_submit, rc);
  atomic_store(&c->t_resize, tko_pool_resize(c->p, 1, 0));
  atomic_store(&c->probe_cancel, 1);
  atomic_store(&c->t_cancel, tko_lanes_cancel(c->l));
  atomic_fetch_add(&c->probes_done, 1);
  return 0;
}

Test(attack_ext, lane_task_and_on_cancel_reenter_their_lanes_and_pool) {
  wd_start("lane_task_and_on_cancel_reenter_their_lanes_and_pool");
  static lctx c;
  memset(&c, 0, sizeof c);
  pthread_mutex_init(&c.mu, NULL);
  g_lctx = &c;
  static ltok tok[40], extra;
  memset(tok, 0, sizeof tok);
  memset(&extra, 0, sizeof extra);
  c.extra = &extra;
  c.p = make_pool(2);
  tko_lane_options o = tko_lane_default_options();
  o.on_cancel = ltok_cancel;
  o.user = &c;
  o.max_drain = 1;
  cr_assert_eq(tko_lanes_create(&c.l, c.p, &o), 0);
  static tt_pin pin;
  pin = (tt_pin)TT_PIN_INIT;
  /* key 1's lane: the probe first, then 39 tasks on key 2 and 1 queued. */
  tok[0].key = 1;
  tok[0].submitter = -1;
  cr_assert_eq(tko_lanes_submit(c.l, 7, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  for (int i = 1; i < 40; i++) {
    tok[i].key = key_of(i % 2 ? 1 : 2);
    tok[i].submitter = -1;
    tok[i].accepted = tko_lanes_submit(c.l, tok[i].key, ltok_run, &tok[i], 0) == 0;
    cr_assert(tok[i].accepted);
  }
  /* the probe goes on key 7's lane behind the pin, so others are queued when it runs */
  tok[0].key = 7;
  tok[0].accepted = tko_lanes_submit(c.l, 7, probing_task, &tok[0], 0) == 0;
  cr_assert(tok[0].accepted);
  /* hold everything: pause so the other lanes stay queued */
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_lanes_wait_idle(c.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&c.probes_done), 1);
  cr_assert_eq(atomic_load(&c.t_wait), -EDEADLK);
  cr_assert_eq(atomic_load(&c.t_destroy), -EDEADLK);
  cr_assert_eq(atomic_load(&c.t_pshut), -EDEADLK);
  cr_assert_eq(atomic_load(&c.t_pwait), -EDEADLK);
  int sw = atomic_load(&c.t_submit_wait);
  cr_assert(sw == -EDEADLK, "submit_wait from a lane task: %d", sw);
  cr_assert_eq(atomic_load(&c.t_submit), 0);
  cr_assert_eq(atomic_load(&c.t_resize), 0);
  cr_assert_eq(atomic_load(&c.t_cancel), 0);
  /* on_cancel ran for the extra task at least (queued behind the probe). */
  cr_assert_eq(atomic_load(&c.cprobes_done), 1);
  cr_assert_eq(atomic_load(&c.c_wait), -EDEADLK);
  cr_assert_eq(atomic_load(&c.c_destroy), -EDEADLK);
  cr_assert_eq(atomic_load(&c.c_submit), -ESHUTDOWN);
  int csw = atomic_load(&c.c_submit_wait);
  cr_assert(csw == -EDEADLK || csw == -ESHUTDOWN, "submit_wait from on_cancel: %d", csw);
  int cps = atomic_load(&c.c_pshut);
  cr_assert(cps == -EDEADLK, "pool shutdown from lanes on_cancel on a worker: %d", cps);
  cr_assert_eq(ltok_bad(tok, 40), -1, "token %ld", ltok_bad(tok, 40));
  cr_assert_eq(ltok_bad(&extra, 1), -1);
  cr_assert_eq(atomic_load(&extra.cancels), 1);
  tko_lane_stats s;
  tko_lanes_stats(c.l, &s);
  cr_assert_eq(s.submitted, s.completed + s.cancelled + s.queued);
  cr_assert_eq(s.queued, 0);
  cr_assert_eq(s.submitted, 42);
  cr_assert_eq(tko_lanes_submit(c.l, 3, tt_nop_fn, NULL, 0), -ESHUTDOWN);
  cr_assert_eq(tko_lanes_destroy(c.l), 0);
  cr_assert_eq(tko_pool_destroy(c.p), 0);
  wd_stop();
}

/* Submitters on colliding (one lane) or spread keys, extreme keys and
 * weights, a tiny max_queued, wait_idle pollers and a resizer, then close
 * and cancel racing each other: exactly once, per-key order, exclusion. */
#define LS_THREADS 4
#define LS_PER 1500
typedef struct ls_thread {
  lctx *c;
  int t;
  ltok *tok;
  atomic_long bad_rc;
} ls_thread;

static atomic_bool ls_stop;
static atomic_long ls_attempts;

static void *ls_submitter(void *arg) {
  ls_thread *th = arg;
  long seq[NK] = {0};
  uint64_t rnd = 0x1234567ull + (uint64_t)th->t;
  for (int i = 0; i < LS_PER; i++) {
    ltok *t = &th->tok[i];
    unsigned k = (unsigned)(tt_rand(&rnd) % 8);
    t->key = key_of(k);
    t->submitter = th->t;
    t->seq = ++seq[k];
    int w = (i % 3 == 0) ? INT_MIN : (i % 3 == 1) ? INT_MAX : 0;
    int rc = tko_lanes_submit(th->c->l, t->key, ltok_run, t, w);
    atomic_fetch_add(&ls_attempts, 1);
    if (rc == 0) t->accepted = true;
    else if (rc == -ESHUTDOWN) break;
    else if (rc != -EAGAIN) atomic_store(&th->bad_rc, rc);
    else seq[k]--;
    if (rc == -EAGAIN) sched_yield();
  }
  return NULL;
}

static atomic_long ls_aux_bad;

static void *ls_waiter(void *arg) {
  lctx *c = arg;
  while (!atomic_load(&ls_stop)) {
    int rc = tko_lanes_wait_idle(c->l, 1);
    if (rc != 0 && rc != -ETIMEDOUT) atomic_store(&ls_aux_bad, rc);
    tko_lane_stats s;
    tko_lanes_stats(c->l, &s);
    if (s.completed + s.cancelled + s.queued > s.submitted) atomic_store(&ls_aux_bad, 1000);
    rc = tko_pool_resize(c->p, 1 + (unsigned)(s.visits % 3), (unsigned)(s.visits % 2));
    if (rc != 0 && rc != -EAGAIN) atomic_store(&ls_aux_bad, rc);
  }
  return NULL;
}

static int do_lclose(void *l) { return tko_lanes_close(l); }
static int do_lcancel(void *l) { return tko_lanes_cancel(l); }

static void lanes_race_scene(bool one_lane, unsigned max_drain, size_t max_queued) {
  static lctx c;
  memset(&c, 0, sizeof c);
  pthread_mutex_init(&c.mu, NULL);
  for (int i = 0; i < 8; i++)
    for (int k = 0; k < NK; k++) c.last_seq[i][k] = 0;
  g_lctx = &c;
  c.one_lane = one_lane;
  atomic_store(&ls_stop, false);
  atomic_store(&ls_attempts, 0);
  atomic_store(&ls_aux_bad, 0);
  static ltok tok[LS_THREADS][LS_PER];
  memset(tok, 0, sizeof tok);
  tko_options po = tko_elastic_options(2, 2, 2);
  po.max_threads = 6;
  cr_assert_eq(tko_pool_create(&c.p, &po), 0);
  tko_lane_options o = tko_lane_default_options();
  o.lanes = one_lane ? 1 : TKO_MAX_LANES / 1024;
  o.max_drain = max_drain;
  o.lane_capacity = 1;
  o.max_queued = max_queued;
  o.on_cancel = ltok_cancel;
  o.user = &c;
  cr_assert_eq(tko_lanes_create(&c.l, c.p, &o), 0);
  if (one_lane) cr_assert_eq(tko_lanes_index(c.l, 0), tko_lanes_index(c.l, UINT64_MAX));
  static ls_thread th[LS_THREADS];
  pthread_t t[LS_THREADS], w;
  for (int i = 0; i < LS_THREADS; i++) {
    th[i] = (ls_thread){.c = &c, .t = i, .tok = tok[i]};
    atomic_store(&th[i].bad_rc, 0);
    cr_assert_eq(pthread_create(&t[i], NULL, ls_submitter, &th[i]), 0);
  }
  cr_assert_eq(pthread_create(&w, NULL, ls_waiter, &c), 0);
  /* let some land, then close and cancel from two threads at once */
  uint64_t end = tt_now_ns() + 20000000000ull;
  for (;;) {
    tko_lane_stats s;
    tko_lanes_stats(c.l, &s);
    if (atomic_load(&ls_attempts) >= LS_THREADS * LS_PER / 3 || tt_now_ns() > end) break;
    sched_yield();
  }
  tf_thread a, b;
  cr_assert_eq(tf_thread_start(&a, do_lclose, c.l), 0);
  cr_assert_eq(tf_thread_start(&b, do_lcancel, c.l), 0);
  int rc = 1;
  cr_assert(tf_thread_join(&a, &rc));
  cr_assert_eq(rc, 0);
  cr_assert(tf_thread_join(&b, &rc));
  cr_assert_eq(rc, 0);
  for (int i = 0; i < LS_THREADS; i++) pthread_join(t[i], NULL);
  cr_assert_eq(tko_lanes_wait_idle(c.l, TT_LONG_MS), 0);
  atomic_store(&ls_stop, true);
  pthread_join(w, NULL);
  cr_assert_eq(atomic_load(&ls_aux_bad), 0, "aux rc %ld", atomic_load(&ls_aux_bad));
  long accepted = 0;
  for (int i = 0; i < LS_THREADS; i++) {
    cr_assert_eq(atomic_load(&th[i].bad_rc), 0, "submit rc %ld", atomic_load(&th[i].bad_rc));
    long bad = ltok_bad(tok[i], LS_PER);
    cr_assert_eq(bad, -1, "thread %d token %ld: runs %d cancels %d accepted %d", i, bad,
                 bad >= 0 ? atomic_load(&tok[i][bad].runs) : 0,
                 bad >= 0 ? atomic_load(&tok[i][bad].cancels) : 0, bad >= 0 ? tok[i][bad].accepted : 0);
    for (int j = 0; j < LS_PER; j++) accepted += tok[i][j].accepted;
  }
  cr_assert_eq(atomic_load(&c.excl_broken), 0, "two tasks of one lane ran at once");
  cr_assert_eq(atomic_load(&c.order_broken), 0, "a key's tasks ran out of submit order");
  tko_lane_stats s;
  tko_lanes_stats(c.l, &s);
  cr_assert_eq(s.submitted, (uint64_t)accepted);
  cr_assert_eq(s.queued, 0);
  cr_assert_eq(s.submitted, s.completed + s.cancelled);
  cr_assert_eq(s.cancelled, (uint64_t)atomic_load(&c.cancel_seen));
  if (one_lane) cr_assert_leq(s.lanes_used, 1);
  if (max_drain) cr_assert_leq(s.max_batch, max_drain);
  cr_assert_eq(tko_lanes_submit(c.l, 1, tt_nop_fn, NULL, 0), -ESHUTDOWN);
  cr_assert_eq(tko_lanes_destroy(c.l), 0);
  cr_assert_eq(tko_pool_destroy(c.p), 0);
}

Test(attack_ext, lanes_one_lane_close_and_cancel_race_submitters) {
  wd_start("lanes_one_lane_close_and_cancel_race_submitters");
  lanes_race_scene(true, 1, 0);
  wd_stop();
}
Test(attack_ext, lanes_spread_max_drain_tiny_max_queued_close_and_cancel_race) {
  wd_start("lanes_spread_max_drain_tiny_max_queued_close_and_cancel_race");
  lanes_race_scene(false, TKO_MAX_LANE_DRAIN, 1);
  wd_stop();
}
Test(attack_ext, lanes_one_lane_default_drain_max_queued_two) {
  wd_start("lanes_one_lane_default_drain_max_queued_two");
  lanes_race_scene(true, 0, 2);
  wd_stop();
}

/* pthread_exit from a lane task on a worker: the lane goes on in order, each
 * task once; with the table closed while it runs, the rest go to on_cancel. */
typedef struct px {
  tt_gate gate;
  tt_count started;
  atomic_int ran[16];
  atomic_int order_bad, next, inflight, excl_bad;
  atomic_int cancelled[16];
} px;

static px g_px;

static int px_task(void *arg) {
  int i = (int)(intptr_t)arg;
  if (atomic_fetch_add(&g_px.inflight, 1) != 0) atomic_store(&g_px.excl_bad, 1);
  if (atomic_load(&g_px.next) != i) atomic_store(&g_px.order_bad, 1 + i);
  atomic_store(&g_px.next, i + 1);
  atomic_fetch_add(&g_px.ran[i], 1);
  atomic_fetch_sub(&g_px.inflight, 1);
  return 0;
}

static int px_exit_task(void *arg) {
  int i = (int)(intptr_t)arg;
  if (atomic_load(&g_px.next) != i) atomic_store(&g_px.order_bad, 1 + i);
  atomic_store(&g_px.next, i + 1);
  atomic_fetch_add(&g_px.ran[i], 1);
  tt_count_add(&g_px.started, 1);
  tt_gate_wait(&g_px.gate);
  pthread_exit(NULL);
}

static void px_cancel(void *u, const tko_lane_task *t) {
  (void)u;
  atomic_fetch_add(&g_px.cancelled[(int)(intptr_t)t->arg], 1);
}

static void px_scene(bool elastic_only, bool close_first, unsigned max_drain) {
  memset(&g_px, 0, sizeof g_px);
  g_px.gate = (tt_gate)TT_GATE_INIT;
  tt_count_init(&g_px.started);
  tko_options po = elastic_only ? tko_elastic_options(0, 2, 1) : tko_basic_options(2);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &po), 0);
  tko_lane_options o = tko_lane_default_options();
  o.max_drain = max_drain;
  o.on_cancel = px_cancel;
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, &o), 0);
  for (int i = 0; i < 16; i++)
    cr_assert_eq(tko_lanes_submit(l, 42, i == 3 ? px_exit_task : px_task, (void *)(intptr_t)i, 0), 0);
  cr_assert(tt_count_wait_geq(&g_px.started, 1));
  if (close_first) cr_assert_eq(tko_lanes_close(l), 0);
  tt_gate_open(&g_px.gate);
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&g_px.excl_bad), 0);
  for (int i = 0; i < 16; i++)
    cr_assert_eq(atomic_load(&g_px.ran[i]) + atomic_load(&g_px.cancelled[i]), 1,
                 "task %d: ran %d cancelled %d", i, atomic_load(&g_px.ran[i]),
                 atomic_load(&g_px.cancelled[i]));
  if (!close_first) {
    cr_assert_eq(atomic_load(&g_px.order_bad), 0, "order broken at %d", atomic_load(&g_px.order_bad) - 1);
    for (int i = 0; i < 16; i++) cr_assert_eq(atomic_load(&g_px.ran[i]), 1);
  } else {
    /* Documented (tko_task_fn): with the table closed, the ending thread runs
     * no more of them and the lane's queued tasks go to on_cancel. */
    for (int i = 4; i < 16; i++)
      cr_assert_eq(atomic_load(&g_px.cancelled[i]), 1, "task %d ran after a closed lane's thread ended", i);
  }
  tko_lane_stats s;
  tko_lanes_stats(l, &s);
  cr_assert_eq(s.submitted, 16);
  cr_assert_eq(s.submitted, s.completed + s.cancelled);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  /* The last runner's task may still be on its way out of the pool (its
   * last touch of the table came first): idle, then the stats. */
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tko_stats ps;
  tko_pool_stats(p, &ps);
  cr_assert_eq(ps.running, 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(attack_ext, lane_task_pthread_exit_keeps_the_lane_going) {
  wd_start("lane_task_pthread_exit_keeps_the_lane_going");
  px_scene(false, false, 0);
  px_scene(false, false, 1);
  px_scene(true, false, 0);
  wd_stop();
}

Test(attack_ext, lane_task_pthread_exit_after_close_cancels_the_rest) {
  wd_start("lane_task_pthread_exit_after_close_cancels_the_rest");
  px_scene(false, true, 0);
  px_scene(true, true, 0);
  wd_stop();
}

/* destroy while a lane task blocks on a worker and other lanes' runners wait
 * in a paused pool; a wait_idle(-1) from another thread; a shrink. */
static int do_ldestroy(void *l) { return tko_lanes_destroy(l); }
static int do_lwait(void *l) { return tko_lanes_wait_idle(l, -1); }

Test(attack_ext, lanes_destroy_waits_for_a_blocked_task_on_a_paused_shrunk_pool) {
  wd_start("lanes_destroy_waits_for_a_blocked_task_on_a_paused_shrunk_pool");
  tko_pool *p = make_pool(2);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  static tt_pin pin;
  static tft_token tok[128];
  memset(tok, 0, sizeof tok);
  for (int round = 0; round < 2; round++) {
    pin = (tt_pin)TT_PIN_INIT;
    cr_assert_eq(tko_lanes_submit(l, 1, tt_pin_fn, &pin, 0), 0);
    cr_assert(tt_count_wait_geq(&pin.started, 1));
    cr_assert_eq(tko_pool_pause(p), 0);
    for (int i = round * 64; i < round * 64 + 64; i++) {
      cr_assert_eq(tko_lanes_submit(l, (uint64_t)i % 5, tft_run, &tok[i], 0), 0);
      tok[i].accepted = true;
    }
    cr_assert_eq(tko_pool_resize(p, 1 + (unsigned)round, 0), 0);
    int rc = 1;
    if (round == 0) {
      /* wait_idle(-1) waits for the blocked task and the paused lanes */
      tf_thread w;
      cr_assert_eq(tf_thread_start(&w, do_lwait, l), 0);
      cr_assert(tf_wait_thread_sleeping(w.tid));
      cr_assert_eq(tko_lanes_wait_idle(l, 0), -ETIMEDOUT);
      cr_assert_not(tf_thread_is_done(&w));
      tt_gate_open(&pin.gate);
      cr_assert_eq(tko_pool_resume(p), 0);
      cr_assert(tf_thread_join(&w, &rc));
      cr_assert_eq(rc, 0);
    } else {
      /* destroy runs the paused lanes here and waits for the blocked task */
      tf_thread d;
      cr_assert_eq(tf_thread_start(&d, do_ldestroy, l), 0);
      cr_assert(tf_wait_thread_sleeping(d.tid));
      cr_assert_not(tf_thread_is_done(&d), "destroy returned while a lane task runs");
      tt_gate_open(&pin.gate);
      cr_assert(tf_thread_join(&d, &rc), "destroy hangs");
      cr_assert_eq(rc, 0);
    }
  }
  cr_assert_eq(tft_first_bad(tok, 128), -1);
  for (int i = 0; i < 128; i++) cr_assert_eq(atomic_load(&tok[i].runs), 1);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  wd_stop();
}

/* Create and submits with an allocator that fails its Nth call, then every
 * third: -ENOMEM with nothing queued or leaked, or exactly-once. */
Test(attack_ext, lanes_create_and_submits_with_failing_allocations) {
  wd_start("lanes_create_and_submits_with_failing_allocations");
  tko_pool *p = make_pool(2);
  static tfa fa;
  bool clean = false;
  static tft_token tok[400];
  for (long n = 1; n < 40 && !clean; n++) {
    tfa_init(&fa);
    tfa_fail_nth(&fa, n);
    tko_lane_options o = tko_lane_default_options();
    o.allocator = &fa.al;
    o.lane_capacity = 1;
    o.lanes = 4;
    tko_lanes *l = NULL;
    int rc = tko_lanes_create(&l, p, &o);
    if (rc != 0) {
      cr_assert_eq(rc, -ENOMEM, "create rc %d", rc);
      cr_assert_eq(atomic_load(&fa.live), 0);
      continue;
    }
    memset(tok, 0, sizeof tok);
    tfa_fail_every(&fa, 3);
    for (int i = 0; i < 400; i++) {
      int s = tko_lanes_submit(l, (uint64_t)i % 7, tft_run, &tok[i], 0);
      cr_assert(s == 0 || s == -ENOMEM, "submit rc %d", s);
      tok[i].accepted = s == 0;
    }
    cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
    tfa_heal(&fa);
    cr_assert_eq(tko_lanes_destroy(l), 0);
    cr_assert_eq(tft_first_bad(tok, 400), -1);
    cr_assert_eq(atomic_load(&fa.live), 0, "lanes leaked %ld", atomic_load(&fa.live));
    clean = atomic_load(&fa.failures) == 0 || n > 30;
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
  wd_stop();
}

/* Option and argument limits. */
Test(attack_ext, lanes_limits_and_null_arguments) {
  wd_start("lanes_limits_and_null_arguments");
  tko_pool *p = make_pool(1);
  tko_lanes *l = NULL;
  tko_lane_options o = tko_lane_default_options();
  o.lanes = TKO_MAX_LANES + 1;
  cr_assert_eq(tko_lanes_create(&l, p, &o), -EINVAL);
  o.lanes = UINT_MAX;
  cr_assert_eq(tko_lanes_create(&l, p, &o), -EINVAL);
  o = tko_lane_default_options();
  o.max_drain = TKO_MAX_LANE_DRAIN + 1;
  cr_assert_eq(tko_lanes_create(&l, p, &o), -EINVAL);
  o = tko_lane_default_options();
  o.lanes = TKO_MAX_LANES - 1; /* rounds up to the limit */
  o.max_drain = TKO_MAX_LANE_DRAIN;
  int rc = tko_lanes_create(&l, p, &o);
  cr_assert(rc == 0 || rc == -ENOMEM, "max lanes rc %d", rc);
  if (rc == 0) {
    static tft_token tok[3];
    memset(tok, 0, sizeof tok);
    uint64_t keys[3] = {0, UINT64_MAX, 1ull << 63};
    for (int i = 0; i < 3; i++) {
      cr_assert_lt(tko_lanes_index(l, keys[i]), TKO_MAX_LANES);
      cr_assert_eq(tko_lanes_submit(l, keys[i], tft_run, &tok[i], i ? INT_MAX : INT_MIN), 0);
      tok[i].accepted = true;
    }
    cr_assert_eq(tko_lanes_submit_wait(l, UINT64_MAX, tt_nop_fn, NULL, INT_MIN), 0);
    cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
    cr_assert_eq(tft_first_bad(tok, 3), -1);
    cr_assert_eq(tko_lanes_destroy(l), 0);
  }
  cr_assert_eq(tko_lanes_create(NULL, p, NULL), -EINVAL);
  cr_assert_eq(tko_lanes_create(&l, NULL, NULL), -EINVAL);
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  cr_assert_eq(tko_lanes_submit(NULL, 1, tt_nop_fn, NULL, 0), -EINVAL);
  cr_assert_eq(tko_lanes_submit(l, 1, NULL, NULL, 0), -EINVAL);
  cr_assert_eq(tko_lanes_submit_wait(l, 1, NULL, NULL, 0), -EINVAL);
  cr_assert_eq(tko_lanes_submit_wait(NULL, 1, tt_nop_fn, NULL, 0), -EINVAL);
  cr_assert_eq(tko_lanes_wait_idle(l, -2), -EINVAL);
  cr_assert_eq(tko_lanes_wait_idle(l, LONG_MIN), -EINVAL);
  cr_assert_eq(tko_lanes_wait_idle(NULL, 0), -EINVAL);
  cr_assert_eq(tko_lanes_wait_idle(l, LONG_MAX), 0, "idle lanes with a huge timeout");
  cr_assert_eq(tko_lanes_close(NULL), -EINVAL);
  cr_assert_eq(tko_lanes_cancel(NULL), -EINVAL);
  cr_assert_eq(tko_lanes_destroy(NULL), -EINVAL);
  cr_assert_eq(tko_lanes_pool_cancelled(NULL), 0);
  tko_lanes_stats(NULL, NULL);
  tko_lanes_stats(l, NULL);
  tko_lane_stats s;
  tko_lanes_stats(NULL, &s);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_coalescer_mark(NULL, 1, 1), -EINVAL);
  cr_assert_eq(tko_coalescer_flush(NULL), -EINVAL);
  cr_assert_eq(tko_coalescer_close(NULL), -EINVAL);
  cr_assert_eq(tko_coalescer_destroy(NULL), -EINVAL);
  cr_assert_eq(tko_coalescer_pool_cancelled(NULL), 0);
  tko_coalescer_stats(NULL, NULL);
  cr_assert_eq(tko_pool_resize(p, 0, 0), -EINVAL);
  cr_assert_eq(tko_pool_resize(p, TKO_MAX_WORKERS + 1, 0), -EINVAL);
  cr_assert_eq(tko_pool_resize(p, 1, TKO_MAX_ELASTIC + 1), -EINVAL);
  cr_assert_eq(tko_pool_resize(NULL, 1, 0), -EINVAL);
  cr_assert_eq(tko_pool_destroy(p), 0);
  wd_stop();
}

/* Elastic-only pool whose workers retire constantly, resized under lanes,
 * submit_wait callers and a coalescer; then a CANCEL shutdown. */
typedef struct el_ctx {
  tko_lanes *l;
  tko_pool *p;
  tft_token *tok;
  int n;
  atomic_long bad;
  tko_coalescer *c;
} el_ctx;

static void *el_submitter(void *arg) {
  el_ctx *e = arg;
  for (int i = 0; i < e->n; i++) {
    int rc = (i % 5 == 0) ? tko_lanes_submit_wait(e->l, (uint64_t)i % 3, tft_run, &e->tok[i], i)
                          : tko_lanes_submit(e->l, (uint64_t)i % 3, tft_run, &e->tok[i], i);
    if (rc == 0) e->tok[i].accepted = true;
    else if (rc == -ECANCELED) e->tok[i].accepted = true; /* handed to on_cancel */
    else if (rc != -ESHUTDOWN) atomic_store(&e->bad, rc);
    if (tko_coalescer_mark(e->c, (uint64_t)i % 9, (uint64_t)i) != 0) atomic_store(&e->bad, 77);
    if (i % 50 == 0) {
      int r = tko_pool_resize(e->p, (unsigned)(i / 50) % 2, 1 + (unsigned)(i / 50) % 3);
      if (r != 0 && r != -ESHUTDOWN && r != -EAGAIN) atomic_store(&e->bad, r);
    }
  }
  return NULL;
}

static void tok_lane_cancel(void *u, const tko_lane_task *t) {
  (void)u;
  atomic_fetch_add(&((tft_token *)t->arg)->cancels, 1);
}

Test(attack_ext, elastic_only_pool_resized_under_lanes_and_a_coalescer) {
  wd_start("elastic_only_pool_resized_under_lanes_and_a_coalescer");
  tko_options po = tko_elastic_options(0, 3, 1);
  po.max_threads = 6;
  static el_ctx e;
  memset(&e, 0, sizeof e);
  cr_assert_eq(tko_pool_create(&e.p, &po), 0);
  tko_lane_options o = tko_lane_default_options();
  o.on_cancel = tok_lane_cancel;
  o.max_drain = 2;
  cr_assert_eq(tko_lanes_create(&e.l, e.p, &o), 0);
  static atomic_long got;
  atomic_store(&got, 0);
  cr_assert_eq(tko_coalescer_create(&e.c, e.p, 1, nop_flush, &got, NULL), 0);
  e.n = TT_SCALE(3000, 600);
  static tft_token tok[3000];
  memset(tok, 0, sizeof tok);
  e.tok = tok;
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, el_submitter, &e), 0);
  pthread_join(t, NULL);
  cr_assert_eq(atomic_load(&e.bad), 0, "rc %ld", atomic_load(&e.bad));
  cr_assert_eq(tko_pool_shutdown(e.p, TKO_CANCEL), 0);
  cr_assert_eq(tko_lanes_wait_idle(e.l, TT_LONG_MS), 0);
  cr_assert_eq(tft_first_bad(tok, (size_t)e.n), -1);
  cr_assert_eq(tko_coalescer_destroy(e.c), 0);
  cr_assert_eq(tko_lanes_destroy(e.l), 0);
  cr_assert_eq(tko_pool_destroy(e.p), 0);
  wd_stop();
}

/* ==== completion queue ============================================================== */

#define CQ_POSTERS 4
#define CQ_PER 4000

typedef struct cq_ctx {
  tko_cq *q;
  atomic_int got[CQ_POSTERS][CQ_PER];
  atomic_long total, order_bad, bad;
  atomic_bool posters_done;
} cq_ctx;

typedef struct cq_poster {
  cq_ctx *x;
  int t;
} cq_poster;

static void *cq_post_main(void *arg) {
  cq_poster *p = arg;
  for (int i = 0; i < CQ_PER; i++) {
    int rc;
    while ((rc = tko_cq_post(p->x->q, ((uint64_t)p->t << 32) | (uint64_t)i, p->t, NULL)) == -EAGAIN)
      sched_yield();
    if (rc != 0) atomic_store(&p->x->bad, rc);
  }
  return NULL;
}

typedef struct cq_drainer {
  cq_ctx *x;
  int last[CQ_POSTERS];
  bool use_take;
  size_t max;
} cq_drainer;

static void cq_one(cq_drainer *d, const tko_completion *c) {
  int t = (int)(c->id >> 32), i = (int)(uint32_t)c->id;
  if (t < 0 || t >= CQ_POSTERS || i < 0 || i >= CQ_PER || c->status != t) {
    atomic_store(&d->x->bad, 999);
    return;
  }
  if (i <= d->last[t]) atomic_fetch_add(&d->x->order_bad, 1);
  d->last[t] = i;
  atomic_fetch_add(&d->x->got[t][i], 1);
  atomic_fetch_add(&d->x->total, 1);
}

static void cq_fn(void *user, const tko_completion *c) { cq_one(user, c); }
static void cq_count_fn(void *user, const tko_completion *c) {
  (void)user;
  (void)c;
}

static void *cq_drain_main(void *arg) {
  cq_drainer *d = arg;
  for (int i = 0; i < CQ_POSTERS; i++) d->last[i] = -1;
  for (;;) {
    bool done = atomic_load(&d->x->posters_done);
    long n;
    if (d->use_take) {
      tko_completion buf[3];
      n = tko_cq_take(d->x->q, buf, d->max);
      for (long k = 0; k < n; k++) cq_one(d, &buf[k]);
    } else {
      n = tko_cq_drain(d->x->q, cq_fn, d, d->max);
    }
    if (n < 0) atomic_store(&d->x->bad, n);
    if (done && n == 0) break;
    if (n == 0) sched_yield();
  }
  return NULL;
}

Test(attack_ext, cq_posters_drainers_and_takers_deliver_each_once_in_order) {
  wd_start("cq_posters_drainers_and_takers_deliver_each_once_in_order");
  static cq_ctx x;
  memset(&x, 0, sizeof x);
  cr_assert_eq(tko_cq_create(&x.q, 5, NULL), 0); /* 8 slots */
  static cq_poster ps[CQ_POSTERS];
  static cq_drainer ds[3];
  pthread_t pt[CQ_POSTERS], dt[3];
  for (int i = 0; i < 3; i++) {
    ds[i] = (cq_drainer){.x = &x, .use_take = i == 2, .max = (size_t)(i == 2 ? 3 : i)};
    cr_assert_eq(pthread_create(&dt[i], NULL, cq_drain_main, &ds[i]), 0);
  }
  for (int i = 0; i < CQ_POSTERS; i++) {
    ps[i] = (cq_poster){&x, i};
    cr_assert_eq(pthread_create(&pt[i], NULL, cq_post_main, &ps[i]), 0);
  }
  for (int i = 0; i < CQ_POSTERS; i++) pthread_join(pt[i], NULL);
  atomic_store(&x.posters_done, true);
  for (int i = 0; i < 3; i++) pthread_join(dt[i], NULL);
  cr_assert_eq(atomic_load(&x.bad), 0, "rc %ld", atomic_load(&x.bad));
  cr_assert_eq(atomic_load(&x.order_bad), 0, "a drainer saw one poster's completions out of order");
  for (int t = 0; t < CQ_POSTERS; t++)
    for (int i = 0; i < CQ_PER; i++) cr_assert_eq(atomic_load(&x.got[t][i]), 1, "t %d i %d", t, i);
  struct pollfd pf = {.fd = tko_cq_fd(x.q), .events = POLLIN};
  (void)poll(&pf, 1, 0); /* may be readable with nothing to take: harmless */
  cr_assert_eq(tko_cq_destroy(x.q), 0);
  wd_stop();
}

static bool readable(tko_cq *q) {
  struct pollfd pf = {.fd = tko_cq_fd(q), .events = POLLIN};
  return poll(&pf, 1, 0) == 1 && (pf.revents & POLLIN);
}

typedef struct repost {
  tko_cq *q;
  int calls, post_rc;
} repost;

static void repost_fn(void *u, const tko_completion *c) {
  repost *r = u;
  (void)c;
  if (r->calls++ == 0) r->post_rc = tko_cq_post(r->q, 100, 0, NULL);
}

Test(attack_ext, cq_limits_readability_and_failing_allocator) {
  wd_start("cq_limits_readability_and_failing_allocator");
  tko_cq *q = NULL;
  cr_assert_eq(tko_cq_create(&q, TKO_MAX_CQ_CAPACITY + 1, NULL), -EINVAL);
  cr_assert_eq(tko_cq_create(&q, SIZE_MAX, NULL), -EINVAL);
  cr_assert_eq(tko_cq_create(NULL, 1, NULL), -EINVAL);
  tko_allocator partial = {tfa_alloc, NULL, NULL, NULL};
  cr_assert_eq(tko_cq_create(&q, 1, &partial), -EINVAL);
  cr_assert_eq(tko_cq_fd(NULL), -EINVAL);
  cr_assert_eq(tko_cq_post(NULL, 1, 0, NULL), -EINVAL);
  cr_assert_eq(tko_cq_drain(NULL, cq_fn, NULL, 0), -EINVAL);
  cr_assert_eq(tko_cq_destroy(NULL), -EINVAL);
  /* capacity 3 rounds up to 4 */
  cr_assert_eq(tko_cq_create(&q, 3, NULL), 0);
  cr_assert_geq(tko_cq_fd(q), 0);
  cr_assert_not(readable(q));
  cr_assert_eq(tko_cq_drain(q, cq_fn, NULL, 0), 0);
  cr_assert_eq(tko_cq_drain(q, NULL, NULL, 0), -EINVAL);
  tko_completion out[8];
  cr_assert_eq(tko_cq_take(q, out, 0), -EINVAL);
  cr_assert_eq(tko_cq_take(q, NULL, 1), -EINVAL);
  for (int i = 0; i < 4; i++) cr_assert_eq(tko_cq_post(q, (uint64_t)i, -i, (void *)(intptr_t)i), 0);
  cr_assert_eq(tko_cq_post(q, 9, 0, NULL), -EAGAIN);
  cr_assert(readable(q));
  cr_assert_eq(tko_cq_destroy(q), -EBUSY);
  cr_assert_eq(tko_cq_take(q, out, 1), 1);
  cr_assert_eq(out[0].id, 0);
  cr_assert(readable(q), "stopped at max: readable again");
  static repost r;
  memset(&r, 0, sizeof r);
  r.q = q;
  cr_assert_eq(tko_cq_drain(q, repost_fn, &r, 0), 3);
  cr_assert_eq(r.post_rc, 0);
  cr_assert(readable(q), "a post accepted during a drain left the descriptor quiet");
  cr_assert_eq(tko_cq_take(q, out, 8), 1);
  cr_assert_eq(out[0].id, 100);
  cr_assert_eq(tko_cq_take(q, out, 8), 0);
  cr_assert_not(readable(q));
  cr_assert_eq(tko_cq_destroy(q), 0);
  /* the Nth allocation failing */
  static tfa fa;
  bool ok = false;
  for (long n = 1; n < 10 && !ok; n++) {
    tfa_init(&fa);
    tfa_fail_nth(&fa, n);
    int rc = tko_cq_create(&q, 16, &fa.al);
    if (rc) {
      cr_assert_eq(rc, -ENOMEM);
      cr_assert_eq(atomic_load(&fa.live), 0);
      continue;
    }
    for (int i = 0; i < 16; i++) cr_assert_eq(tko_cq_post(q, (uint64_t)i, 0, NULL), 0);
    cr_assert_eq(tko_cq_post(q, 99, 0, NULL), -EAGAIN);
    cr_assert_eq(tko_cq_take(q, out, 8), 8);
    cr_assert_eq(tko_cq_drain(q, cq_count_fn, NULL, 0), 8);
    cr_assert_eq(tko_cq_destroy(q), 0);
    cr_assert_eq(atomic_load(&fa.live), 0);
    ok = atomic_load(&fa.failures) == 0;
  }
  cr_assert(ok);
  wd_stop();
}

/* Tasks post their results from the pool's after_run hook while the pool is
 * shut down with CANCEL and the loop drains: every task that ran posted
 * once, every other one reached on_cancel once, and the loop got each
 * posted one once. */
#define HK_N 2000
typedef struct hk {
  tko_cq *q;
  atomic_long posted, delivered;
  atomic_bool stop;
  atomic_int got[HK_N];
  tft_token tok[HK_N];
} hk;

static void post_after_run(void *u, const tko_task_info *t) {
  hk *h = u;
  int rc;
  while ((rc = tko_cq_post(h->q, t->id, 0, t->arg)) == -EAGAIN) sched_yield();
  if (rc == 0) atomic_fetch_add(&h->posted, 1);
}

static void hk_fn(void *u, const tko_completion *c) {
  hk *h = u;
  atomic_fetch_add(&h->got[(tft_token *)c->user - h->tok], 1);
  atomic_fetch_add(&h->delivered, 1);
}

static void *hk_loop(void *arg) {
  hk *h = arg;
  struct pollfd pf = {.fd = tko_cq_fd(h->q), .events = POLLIN};
  for (;;) {
    bool stop = atomic_load(&h->stop);
    (void)poll(&pf, 1, 10);
    long n = tko_cq_drain(h->q, hk_fn, h, 7);
    if (n < 0) return NULL;
    if (stop && n == 0) return NULL;
  }
}

Test(attack_ext, cq_fed_by_after_run_during_a_cancel_shutdown) {
  wd_start("cq_fed_by_after_run_during_a_cancel_shutdown");
  static hk h;
  memset(&h, 0, sizeof h);
  cr_assert_eq(tko_cq_create(&h.q, 16, NULL), 0);
  tko_options o = tko_elastic_options(2, 2, 1);
  o.hooks.user = &h;
  o.hooks.after_run = post_after_run;
  o.hooks.on_cancel = tft_on_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  pthread_t lt;
  cr_assert_eq(pthread_create(&lt, NULL, hk_loop, &h), 0);
  for (int i = 0; i < HK_N; i++) {
    int rc = tko_submit(p, tft_run, &h.tok[i], i % 7);
    cr_assert_eq(rc, 0);
    h.tok[i].accepted = true;
    if (i == HK_N / 2) cr_assert_eq(tko_pool_resize(p, 1, 3), 0);
  }
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  atomic_store(&h.stop, true);
  pthread_join(lt, NULL);
  cr_assert_eq(tft_first_bad(h.tok, HK_N), -1);
  long runs = 0;
  for (int i = 0; i < HK_N; i++) {
    runs += atomic_load(&h.tok[i].runs);
    cr_assert_eq(atomic_load(&h.got[i]), atomic_load(&h.tok[i].runs), "task %d", i);
  }
  cr_assert_eq(atomic_load(&h.posted), runs);
  cr_assert_eq(atomic_load(&h.delivered), runs);
  cr_assert_eq(tko_cq_destroy(h.q), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  wd_stop();
}

/* ==== fork ============================================================================ */

/* A child forked while a lane task runs, and from inside flush_fn and a lane
 * task: every call on the parent's objects is -ECHILD (destroy 0). */
typedef struct fk {
  tko_pool *p;
  tko_lanes *l;
  tko_coalescer *c;
  atomic_int result; /* the child's verdict, 0 ok, else the failing step */
  atomic_int forked;
} fk;

static int child_checks(fk *f) {
  int step = 0;
#define CHK(expr, want)          \
  do {                           \
    step++;                      \
    int got_ = (expr);           \
    if (got_ != (want)) return step * 1000 - got_; \
  } while (0)
  CHK(tko_coalescer_mark(f->c, 1, 1), -ECHILD);
  CHK(tko_coalescer_flush(f->c), -ECHILD);
  CHK(tko_coalescer_close(f->c), -ECHILD);
  CHK(tko_lanes_submit(f->l, 1, tt_nop_fn, NULL, 0), -ECHILD);
  CHK(tko_lanes_submit_wait(f->l, 1, tt_nop_fn, NULL, 0), -ECHILD);
  CHK(tko_lanes_wait_idle(f->l, 0), -ECHILD);
  CHK(tko_lanes_close(f->l), -ECHILD);
  CHK(tko_lanes_cancel(f->l), -ECHILD);
  CHK(tko_pool_resize(f->p, 2, 1), -ECHILD);
  CHK(tko_submit(f->p, tt_nop_fn, NULL, 0), -ECHILD);
  CHK(tko_lanes_destroy(f->l), 0);
  CHK(tko_coalescer_destroy(f->c), 0);
  CHK(tko_pool_destroy(f->p), 0);
#undef CHK
  return 0;
}

static void fork_here(fk *f) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(30);
    int r = child_checks(f);
    if (r) fprintf(stderr, "child: check failed, code %d (step*1000 - rc)\n", r);
    tt_child_exit(r == 0 ? 0 : 1 + (r / 1000) % 200);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) {
    atomic_store(&f->result, -1);
    return;
  }
  atomic_store(&f->result, WIFEXITED(st) ? WEXITSTATUS(st) : 0x100 + WTERMSIG(st));
}

static void fork_flush(void *u, const tko_coalesce_entry *e, size_t n) {
  (void)e;
  (void)n;
  fk *f = u;
  if (atomic_exchange(&f->forked, 1) == 0) fork_here(f);
}

static int fork_task(void *arg) {
  fork_here(arg);
  return 0;
}

Test(attack_ext, forked_children_from_a_lane_task_and_flush_fn_get_echild) {
#ifdef AX_TSAN
  cr_skip_test("fork with pool threads under TSan");
#endif
  wd_start("forked_children_from_a_lane_task_and_flush_fn_get_echild");
  static fk f;
  memset(&f, 0, sizeof f);
  f.p = make_pool(2);
  cr_assert_eq(tko_lanes_create(&f.l, f.p, NULL), 0);
  cr_assert_eq(tko_coalescer_create(&f.c, f.p, 0, fork_flush, &f, NULL), 0);
  /* from a lane task */
  atomic_store(&f.result, 1234);
  cr_assert_eq(tko_lanes_submit_wait(f.l, 3, fork_task, &f, 0), 0);
  cr_assert_eq(atomic_load(&f.result), 0, "child of a caller-run lane task: %d", atomic_load(&f.result));
  atomic_store(&f.result, 1234);
  cr_assert_eq(tko_lanes_submit(f.l, 4, fork_task, &f, 0), 0);
  cr_assert_eq(tko_lanes_wait_idle(f.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&f.result), 0, "child of a lane task on a worker: %d", atomic_load(&f.result));
  /* from flush_fn on this thread */
  atomic_store(&f.result, 1234);
  cr_assert_eq(tko_coalescer_mark(f.c, 1, 1), 0);
  cr_assert_eq(tko_coalescer_flush(f.c), 0);
  cr_assert_eq(atomic_load(&f.result), 0, "child of flush_fn: %d", atomic_load(&f.result));
  cr_assert_eq(tko_coalescer_destroy(f.c), 0);
  cr_assert_eq(tko_lanes_destroy(f.l), 0);
  cr_assert_eq(tko_pool_destroy(f.p), 0);
  wd_stop();
}

/* ==== more: submit_wait exactly-once by return code, self-resubmitting lane
 * tasks meeting a pool DRAIN, a blocked sweep holding destroy, busy forks. */

typedef struct sw_ctx {
  tko_lanes *l;
  tko_pool *p;
  tft_token tok[4][400];
  int rcs[4][400];
  atomic_long bad;
} sw_ctx;

typedef struct sw_thread {
  sw_ctx *x;
  int t;
} sw_thread;

static void *sw_main(void *arg) {
  sw_thread *th = arg;
  for (int i = 0; i < 400; i++) {
    int rc = (i % 2) ? tko_lanes_submit_wait(th->x->l, (uint64_t)(i % 3), tft_run, &th->x->tok[th->t][i], 0)
                     : tko_lanes_submit(th->x->l, (uint64_t)(i % 3), tft_run, &th->x->tok[th->t][i], 0);
    th->x->rcs[th->t][i] = rc;
    th->x->tok[th->t][i].accepted = rc == 0 || rc == -ECANCELED;
    if (rc != 0 && rc != -ECANCELED && rc != -ESHUTDOWN) atomic_store(&th->x->bad, rc);
    if (rc == -ECANCELED && !(i % 2)) atomic_store(&th->x->bad, 555);
  }
  return NULL;
}

static void sw_scene(int how) {
  static sw_ctx x;
  memset(&x, 0, sizeof x);
  tko_options po = tko_basic_options(2);
  cr_assert_eq(tko_pool_create(&x.p, &po), 0);
  tko_lane_options o = tko_lane_default_options();
  o.lanes = 1;
  o.max_drain = 3;
  o.on_cancel = tok_lane_cancel;
  cr_assert_eq(tko_lanes_create(&x.l, x.p, &o), 0);
  static sw_thread th[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    th[i] = (sw_thread){&x, i};
    cr_assert_eq(pthread_create(&t[i], NULL, sw_main, &th[i]), 0);
  }
  uint64_t end = tt_now_ns() + 20000000000ull;
  for (;;) {
    tko_lane_stats s;
    tko_lanes_stats(x.l, &s);
    if (s.submitted >= 300 || tt_now_ns() > end) break;
    sched_yield();
  }
  if (how == 0) cr_assert_eq(tko_lanes_cancel(x.l), 0);
  if (how == 1) cr_assert_eq(tko_pool_shutdown(x.p, TKO_CANCEL), 0);
  if (how == 2) cr_assert_eq(tko_pool_shutdown(x.p, TKO_CANCEL_NOWAIT), 0);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  cr_assert_eq(tko_lanes_wait_idle(x.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&x.bad), 0, "rc %ld", atomic_load(&x.bad));
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 400; j++) {
      tft_token *k = &x.tok[i][j];
      int r = atomic_load(&k->runs), c = atomic_load(&k->cancels), rc = x.rcs[i][j];
      if (j % 2) {
        cr_assert(rc != 0 || (r == 1 && c == 0), "submit_wait 0 but runs %d cancels %d", r, c);
        cr_assert(rc != -ECANCELED || (r == 0 && c == 1), "-ECANCELED but runs %d cancels %d", r, c);
      }
      cr_assert(rc != -ESHUTDOWN || (r == 0 && c == 0), "refused but runs %d cancels %d", r, c);
      if (rc == 0 && !(j % 2)) cr_assert_eq(r + c, 1, "accepted submit: runs %d cancels %d", r, c);
    }
  tko_lane_stats s;
  tko_lanes_stats(x.l, &s);
  cr_assert_eq(s.submitted, s.completed + s.cancelled);
  cr_assert_eq(tko_lanes_destroy(x.l), 0);
  cr_assert_eq(tko_pool_destroy(x.p), 0);
}

Test(attack_ext, submit_wait_return_codes_agree_with_what_happened) {
  wd_start("submit_wait_return_codes_agree_with_what_happened");
  sw_scene(0);
  sw_scene(1);
  sw_scene(2);
  wd_stop();
}

/* Lane tasks that resubmit themselves (and mark a coalescer) while the pool
 * is destroyed with the table attached (-EBUSY after a DRAIN): every
 * accepted resubmission runs exactly once, refusals are -ESHUTDOWN. */
#define CH_MAX 100000
typedef struct chain {
  tko_lanes *l;
  tko_coalescer *c;
  atomic_int runs[CH_MAX];
  atomic_long next, bad, refused;
  tt_count started;
} chain;

static chain g_ch;

static int chain_fn(void *arg) {
  long i = (long)(intptr_t)arg;
  atomic_fetch_add(&g_ch.runs[i], 1);
  tt_count_add(&g_ch.started, 1);
  int m = tko_coalescer_mark(g_ch.c, (uint64_t)i % 5, (uint64_t)i);
  if (m != 0 && m != -ESHUTDOWN) atomic_store(&g_ch.bad, 1000 + m);
  long n = atomic_fetch_add(&g_ch.next, 1);
  if (n >= CH_MAX) return 0;
  int rc = tko_lanes_submit(g_ch.l, (uint64_t)n % 4, chain_fn, (void *)(intptr_t)n, 0);
  if (rc == -ESHUTDOWN) {
    atomic_store(&g_ch.runs[n], 100); /* marks "refused" */
    atomic_fetch_add(&g_ch.refused, 1);
  } else if (rc != 0) {
    atomic_store(&g_ch.bad, rc);
  }
  return 0;
}

static int do_pdestroy(void *p) { return tko_pool_destroy(p); }

Test(attack_ext, self_resubmitting_lane_tasks_meet_a_busy_pool_destroy) {
  wd_start("self_resubmitting_lane_tasks_meet_a_busy_pool_destroy");
  memset(&g_ch, 0, sizeof g_ch);
  tt_count_init(&g_ch.started);
  tko_pool *p = make_pool(2);
  cr_assert_eq(tko_lanes_create(&g_ch.l, p, NULL), 0);
  static atomic_long got;
  atomic_store(&got, 0);
  cr_assert_eq(tko_coalescer_create(&g_ch.c, p, 1, nop_flush, &got, NULL), 0);
  atomic_store(&g_ch.next, 4);
  for (long i = 0; i < 4; i++)
    cr_assert_eq(tko_lanes_submit(g_ch.l, (uint64_t)i, chain_fn, (void *)(intptr_t)i, 0), 0);
  cr_assert(tt_count_wait_geq(&g_ch.started, 500));
  tf_thread d;
  cr_assert_eq(tf_thread_start(&d, do_pdestroy, p), 0);
  int rc = 1;
  cr_assert(tf_thread_join(&d, &rc));
  cr_assert_eq(rc, -EBUSY);
  cr_assert_eq(tko_lanes_wait_idle(g_ch.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&g_ch.bad), 0, "rc %ld", atomic_load(&g_ch.bad));
  long n = atomic_load(&g_ch.next);
  cr_assert_lt(n, CH_MAX, "the chains outran the destroy");
  for (long i = 0; i < n; i++) {
    int r = atomic_load(&g_ch.runs[i]);
    cr_assert(r == 1 || r == 100, "task %ld ran %d times", i, r);
  }
  cr_assert_eq(atomic_load(&g_ch.refused), 4, "each chain ends with one refusal");
  tko_lane_stats s;
  tko_lanes_stats(g_ch.l, &s);
  cr_assert_eq(s.submitted, s.completed);
  cr_assert_eq(s.cancelled, 0);
  cr_assert_eq(tko_coalescer_destroy(g_ch.c), 0);
  cr_assert_eq(tko_lanes_destroy(g_ch.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  wd_stop();
}

/* destroy with a sweep blocked in flush_fn on a worker: it waits, and every
 * mark made before it is flushed. */
Test(attack_ext, coalescer_destroy_waits_for_a_sweep_blocked_on_a_worker) {
  wd_start("coalescer_destroy_waits_for_a_sweep_blocked_on_a_worker");
  static crec r;
  crec_init(&r);
  static tt_gate g;
  g = (tt_gate)TT_GATE_INIT;
  tko_pool *p = make_pool(1);
  cr_assert_eq(tko_coalescer_create(&r.c, p, 1, crec_flush, &r, NULL), 0);
  atomic_store(&r.block, &g);
  cr_assert_eq(tko_coalescer_mark(r.c, key_of(5), 1), 0);
  cr_assert(tt_count_wait_geq(&r.blocked, 1));
  atomic_store(&r.block, (tt_gate *)NULL);
  cr_assert_eq(tko_coalescer_mark(r.c, key_of(5), 2), 0);
  cr_assert_eq(tko_coalescer_mark(r.c, key_of(6), 3), 0);
  tf_thread d;
  cr_assert_eq(tf_thread_start(&d, do_cdestroy, r.c), 0);
  cr_assert(tf_wait_thread_sleeping(d.tid));
  cr_assert_not(tf_thread_is_done(&d), "destroy returned while a sweep runs on a worker");
  tt_gate_open(&g);
  int rc = 1;
  cr_assert(tf_thread_join(&d, &rc));
  cr_assert_eq(rc, 0);
  cr_assert(crec_saw(&r, key_of(5), 2));
  cr_assert(crec_saw(&r, key_of(6), 3));
  crec_check(&r);
  cr_assert_eq(tko_pool_destroy(p), 0);
  wd_stop();
}

/* Forks while markers, lane submitters and the coalescer's thread are busy:
 * each child gets -ECHILD and destroys its copies without hanging. */
typedef struct bf {
  fk f;
  atomic_bool stop;
  atomic_long bad;
} bf;

static void *bf_marker(void *arg) {
  bf *b = arg;
  uint64_t v = 0;
  while (!atomic_load(&b->stop)) {
    int rc = tko_coalescer_mark(b->f.c, v % 300, v);
    if (rc) atomic_store(&b->bad, rc);
    rc = tko_lanes_submit(b->f.l, v % 7, tt_nop_fn, NULL, 0);
    if (rc) atomic_store(&b->bad, rc);
    v++;
  }
  return NULL;
}

static void bf_flush(void *u, const tko_coalesce_entry *e, size_t n) {
  (void)u;
  (void)e;
  (void)n;
}

Test(attack_ext, forks_while_everything_is_busy) {
#ifdef TT_SANITIZED
  cr_skip_test("fork of a busy multi-threaded process under a sanitizer");
#endif
  wd_start("forks_while_everything_is_busy");
  static bf b;
  memset(&b, 0, sizeof b);
  b.f.p = make_pool(2);
  cr_assert_eq(tko_lanes_create(&b.f.l, b.f.p, NULL), 0);
  cr_assert_eq(tko_coalescer_create(&b.f.c, b.f.p, 1, bf_flush, NULL, NULL), 0);
  pthread_t t[2];
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&t[i], NULL, bf_marker, &b), 0);
  for (int i = 0; i < 20; i++) {
    fork_here(&b.f);
    cr_assert_eq(atomic_load(&b.f.result), 0, "fork %d: child result %d", i, atomic_load(&b.f.result));
  }
  atomic_store(&b.stop, true);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  cr_assert_eq(atomic_load(&b.bad), 0);
  cr_assert_eq(tko_coalescer_destroy(b.f.c), 0);
  cr_assert_eq(tko_lanes_destroy(b.f.l), 0);
  cr_assert_eq(tko_pool_destroy(b.f.p), 0);
  wd_stop();
}

/* Waits with huge timeouts (LONG_MAX and just under it) on busy objects must
 * wait, not overflow a deadline into an immediate -ETIMEDOUT. */
typedef struct hw {
  tko_lanes *l;
  tko_pool *p;
  long ms;
  int which;
} hw;

static int hw_wait(void *arg) {
  hw *h = arg;
  switch (h->which) {
  case 0: return tko_lanes_wait_idle(h->l, h->ms);
  case 1: return tko_pool_wait_idle(h->p, h->ms);
  default: return tko_pool_shutdown_timed(h->p, TKO_DRAIN, h->ms);
  }
}

Test(attack_ext, huge_timeouts_wait_instead_of_timing_out) {
  wd_start("huge_timeouts_wait_instead_of_timing_out");
  static const long huge[] = {LONG_MAX, LONG_MAX - 1, LONG_MAX / 1000, LONG_MAX / 1000000 + 1,
                              (long)(UINT32_MAX) + 1, 9223372036854L};
  for (int which = 0; which < 3; which++)
    for (size_t k = 0; k < sizeof huge / sizeof huge[0]; k++) {
      static hw h;
      memset(&h, 0, sizeof h);
      h.p = make_pool(1);
      cr_assert_eq(tko_lanes_create(&h.l, h.p, NULL), 0);
      static tt_pin pin;
      pin = (tt_pin)TT_PIN_INIT;
      cr_assert_eq(tko_lanes_submit(h.l, 1, tt_pin_fn, &pin, 0), 0);
      cr_assert(tt_count_wait_geq(&pin.started, 1));
      h.ms = huge[k];
      h.which = which;
      tf_thread t;
      cr_assert_eq(tf_thread_start(&t, hw_wait, &h), 0);
      cr_assert(tf_wait_thread_sleeping(t.tid));
      /* give a broken deadline every chance to show: the waiter must still be waiting */
      for (int spin = 0; spin < 1000 && !tf_thread_is_done(&t); spin++) sched_yield();
      bool early = tf_thread_is_done(&t);
      tt_gate_open(&pin.gate);
      int rc = 1;
      cr_assert(tf_thread_join(&t, &rc));
      cr_assert(!early, "wait %d with timeout %ld returned %d while busy", which, huge[k], rc);
      cr_assert_eq(rc, 0, "wait %d with timeout %ld: %d", which, huge[k], rc);
      cr_assert_eq(tko_lanes_destroy(h.l), 0);
      cr_assert_eq(tko_pool_destroy(h.p), 0);
    }
  wd_stop();
}

/* A drain callback that drains or takes again (nested): each completion is
 * delivered exactly once and nothing deadlocks. */
typedef struct nd {
  tko_cq *q;
  atomic_int got[256];
  int depth;
  long inner;
} nd;

static void nd_fn(void *u, const tko_completion *c) {
  nd *x = u;
  atomic_fetch_add(&x->got[c->id], 1);
  if (x->depth < 3) {
    x->depth++;
    if (x->depth % 2) {
      long n = tko_cq_drain(x->q, nd_fn, x, 2);
      if (n > 0) x->inner += n;
    } else {
      tko_completion out[2];
      long n = tko_cq_take(x->q, out, 2);
      for (long i = 0; i < n; i++) atomic_fetch_add(&x->got[out[i].id], 1);
      if (n > 0) x->inner += n;
    }
    x->depth--;
  }
}

Test(attack_ext, cq_nested_drains_deliver_each_once) {
  wd_start("cq_nested_drains_deliver_each_once");
  static nd x;
  memset(&x, 0, sizeof x);
  cr_assert_eq(tko_cq_create(&x.q, 256, NULL), 0);
  for (int i = 0; i < 256; i++) cr_assert_eq(tko_cq_post(x.q, (uint64_t)i, 0, NULL), 0);
  long total = 0;
  for (int round = 0; round < 1000 && total < 256; round++) {
    long before = x.inner;
    long n = tko_cq_drain(x.q, nd_fn, &x, 3);
    cr_assert_geq(n, 0);
    total += n + (x.inner - before);
  }
  cr_assert_eq(total, 256);
  for (int i = 0; i < 256; i++) cr_assert_eq(atomic_load(&x.got[i]), 1, "completion %d", i);
  cr_assert_eq(tko_cq_destroy(x.q), 0);
  wd_stop();
}

/* flush_fn ending its worker with pthread_exit (a sweep is a pool task on a
 * worker, where pthread_exit is supported for tasks): the sweep ends as if
 * flush_fn had returned, so tko_coalescer_flush, close and destroy do not
 * wait for a sweep that stays "running". */
static atomic_int fx_calls;
static void exit_flush(void *u, const tko_coalesce_entry *e, size_t n) {
  (void)e;
  (void)n;
  tt_count_add(u, 1);
  if (atomic_fetch_add(&fx_calls, 1) == 0) pthread_exit(NULL);
}

Test(attack_ext, flush_fn_ending_its_worker_with_pthread_exit) {
  atomic_store(&fx_calls, 0);
  static tt_count calls;
  tt_count_init(&calls);
  tko_pool *p = make_pool(2);
  tko_coalescer *c;
  cr_assert_eq(tko_coalescer_create(&c, p, 1, exit_flush, &calls, NULL), 0);
  cr_assert_eq(tko_coalescer_mark(c, 1, 1), 0);
  cr_assert(tt_count_wait_geq(&calls, 1)); /* the sweep on a worker ended its thread */
  cr_assert_eq(tko_coalescer_mark(c, 2, 2), 0);
  tf_thread f;
  cr_assert_eq(tf_thread_start(&f, do_flush, c), 0);
  int rc = 1;
  cr_assert(tf_thread_join_within(&f, 10000, &rc),
            "tko_coalescer_flush hangs after flush_fn ended its worker with pthread_exit");
  cr_assert_eq(rc, 0);
  cr_assert_geq(tt_count_get(&calls), 2, "key 2 was never flushed");
  cr_assert_eq(tko_coalescer_destroy(c), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}
