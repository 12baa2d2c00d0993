/* SPDX-License-Identifier: MIT */
/* Tests for the blocking hint (tko_blocking_begin / tko_blocking_end): on
 * an elastic pool of 1 basic + 3 elastic workers, four tasks that announce
 * they block and then wait on a condition variable all run at once (the
 * pool adds elastic workers), stats.blocking counts them, and the extra
 * workers retire as usual afterwards; calls nest; a basic pool accepts the
 * hint; -EPERM off the pool's worker threads (the test thread, a caller-runs
 * task, an async completer); and shutdown, DRAIN or CANCEL, waits for
 * blocked tasks. No test sleeps to wait for something. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

typedef struct kctx {
  tt_count inside; /* tasks inside their blocking region now */
  tt_count runs;   /* tasks that finished */
  tt_count cancels;
  tt_count elastic_stops; /* elastic threads that ended */
  tt_gate gate;
  atomic_int bad;          /* a begin/end that did not return what it should */
  atomic_uint nested_seen; /* stats.blocking seen from inside a nested region */
  tko_pool *pool;
} kctx;

static void kctx_init(kctx *c) {
  memset(c, 0, sizeof *c);
  tt_count_init(&c->inside);
  tt_count_init(&c->runs);
  tt_count_init(&c->cancels);
  tt_count_init(&c->elastic_stops);
  pthread_mutex_init(&c->gate.mu, NULL);
  pthread_cond_init(&c->gate.cv, NULL);
  atomic_init(&c->bad, 0);
  atomic_init(&c->nested_seen, 0);
}

/* Announces a block, then blocks on the gate like an I/O wait. */
static int blocking_fn(void *arg) {
  kctx *c = arg;
  if (tko_blocking_begin() != 0) atomic_fetch_add(&c->bad, 1);
  tt_count_add(&c->inside, 1);
  if (!tt_gate_wait(&c->gate)) atomic_fetch_add(&c->bad, 1);
  tt_count_add(&c->inside, -1);
  if (tko_blocking_end() != 0) atomic_fetch_add(&c->bad, 1);
  tt_count_add(&c->runs, 1);
  return 0;
}

static int plain_fn(void *arg) {
  tt_count_add(&((kctx *)arg)->runs, 1);
  return 0;
}

static void thread_stop(void *user, unsigned index, tko_worker_kind kind) {
  if (kind == TKO_WORKER_ELASTIC) tt_count_add(&((kctx *)user)->elastic_stops, 1);
}

static void on_cancel(void *user, const tko_task_info *t) {
  tt_count_add(&((kctx *)user)->cancels, 1);
}

static tko_pool *make_pool(kctx *c, unsigned basic, unsigned elastic, unsigned idle_ms) {
  tko_options o = elastic ? tko_elastic_options(basic, elastic, idle_ms) : tko_basic_options(basic);
  o.hooks.user = c;
  o.hooks.thread_stop = thread_stop;
  o.hooks.on_cancel = on_cancel;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  c->pool = p;
  return p;
}

/* Waits until no elastic worker is alive. The stop count is read before the
 * stats: a worker counted alive there releases its count before its
 * thread_stop hook runs, so its stop is still to come and the wait ends. */
static void wait_elastic_retired(kctx *c) {
  for (;;) {
    long stops = tt_count_get(&c->elastic_stops);
    if (tf_stats(c->pool).elastic_workers == 0) return;
    cr_assert(tt_count_wait_geq(&c->elastic_stops, stops + 1), "elastic workers did not retire");
  }
}

Test(blocking, eperm_outside_a_worker) {
  cr_assert_eq(tko_blocking_begin(), -EPERM);
  cr_assert_eq(tko_blocking_end(), -EPERM);
}

/* A caller-runs task runs on the submitting thread: not a worker. */
typedef struct rc_pair {
  int begin, end;
} rc_pair;

static int hint_probe(void *arg) {
  rc_pair *r = arg;
  r->begin = tko_blocking_begin();
  r->end = tko_blocking_end();
  return 0;
}

Test(blocking, eperm_in_a_caller_runs_task) {
  kctx c;
  kctx_init(&c);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  rc_pair queued = {1, 1}, here = {1, 1};
  cr_assert_eq(tko_pool_pause(pool), 0);
  cr_assert_eq(tko_submit(pool, hint_probe, &queued, 0), 0);
  cr_assert_eq(tko_submit(pool, hint_probe, &here, 0), 0); /* full: runs here */
  cr_assert_eq(here.begin, -EPERM);
  cr_assert_eq(here.end, -EPERM);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(queued.begin, 0, "a worker may give the hint");
  cr_assert_eq(queued.end, 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* An async task's completer is any thread: not a worker either. */
typedef struct async_probe {
  tko_async *op;
  tt_count started;
  int in_fn_begin, in_fn_end;
} async_probe;

static int async_probe_fn(tko_async *op, void *arg) {
  async_probe *p = arg;
  p->in_fn_begin = tko_blocking_begin(); /* fn runs on a worker */
  p->in_fn_end = tko_blocking_end();
  pthread_mutex_lock(&p->started.mu);
  p->op = op;
  pthread_mutex_unlock(&p->started.mu);
  tt_count_add(&p->started, 1);
  return 0;
}

static int complete_with_probe(void *arg) {
  async_probe *p = arg;
  int b = tko_blocking_begin(), e = tko_blocking_end();
  pthread_mutex_lock(&p->started.mu);
  tko_async *op = p->op;
  pthread_mutex_unlock(&p->started.mu);
  int rc = tko_async_complete(op, 0);
  return b == -EPERM && e == -EPERM && rc == 0 ? 0 : 1;
}

Test(blocking, eperm_on_an_async_completer_thread) {
  kctx c;
  kctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 0, 0);
  async_probe p;
  memset(&p, 0, sizeof p);
  tt_count_init(&p.started);
  cr_assert_eq(tko_submit_async(pool, async_probe_fn, &p, 0), 0);
  cr_assert(tt_count_wait_geq(&p.started, 1));
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, complete_with_probe, &p), 0);
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  cr_assert_eq(p.in_fn_begin, 0);
  cr_assert_eq(p.in_fn_end, 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

Test(blocking, four_blocked_tasks_run_at_once) {
  kctx c;
  kctx_init(&c);
  /* A short idle timeout, so the retirement at the end comes soon. */
  tko_pool *pool = make_pool(&c, 1, 3, 50);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(tko_submit(pool, blocking_fn, &c, 0), 0);
  cr_assert(tt_count_wait_eq(&c.inside, 4), "the pool did not run 4 blocked tasks at once");
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.blocking, 4);
  cr_assert_eq(s.running, 4);
  cr_assert_eq(s.basic_workers, 1);
  cr_assert_eq(s.elastic_workers, 3);
  cr_assert_leq(s.elastic_peak, 3);
  /* Other work still gets done? Not here: every worker is blocked, and the
   * maximum is reached, so a fifth task waits its turn. */
  cr_assert_eq(tko_submit(pool, plain_fn, &c, 0), 0);
  tt_gate_open(&c.gate);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tt_count_get(&c.runs), 5);
  s = tf_stats(pool);
  cr_assert_eq(s.blocking, 0);
  /* The extra workers retire as usual once idle. */
  wait_elastic_retired(&c);
  /* The three that ran the blocked tasks retired (a retirement is counted
   * before the worker's thread_stop hook runs). */
  cr_assert(tt_count_wait_geq(&c.elastic_stops, 3));
  s = tf_stats(pool);
  cr_assert_eq(s.elastic_workers, 0);
  cr_assert_geq(s.elastic_retired, 3);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* Begin twice, end twice: both pairs succeed and the count returns to 0. */
static int nested_fn(void *arg) {
  kctx *c = arg;
  if (tko_blocking_begin() != 0) atomic_fetch_add(&c->bad, 1);
  if (tko_blocking_begin() != 0) atomic_fetch_add(&c->bad, 1);
  tko_stats s;
  tko_pool_stats(c->pool, &s);
  atomic_store(&c->nested_seen, s.blocking);
  if (tko_blocking_end() != 0) atomic_fetch_add(&c->bad, 1);
  if (tko_blocking_end() != 0) atomic_fetch_add(&c->bad, 1);
  tt_count_add(&c->runs, 1);
  return 0;
}

Test(blocking, calls_nest) {
  kctx c;
  kctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 2, 50);
  cr_assert_eq(tko_submit(pool, nested_fn, &c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tt_count_get(&c.runs), 1);
  cr_assert_geq(atomic_load(&c.nested_seen), 1);
  cr_assert_eq(tf_stats(pool).blocking, 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

Test(blocking, a_basic_pool_accepts_the_hint) {
  kctx c;
  kctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 0, 0);
  cr_assert_eq(tko_submit(pool, blocking_fn, &c, 0), 0);
  cr_assert(tt_count_wait_eq(&c.inside, 1));
  cr_assert_eq(tko_submit(pool, plain_fn, &c, 0), 0); /* waits: no elastic workers */
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.blocking, 1);
  cr_assert_eq(s.elastic_workers, 0);
  cr_assert_eq(s.elastic_spawned, 0);
  tt_gate_open(&c.gate);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tt_count_get(&c.runs), 2);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

/* ---- shutdown ------------------------------------------------------------ */

static int shutdown_drain(void *pool) {
  return tko_pool_shutdown(pool, TKO_DRAIN);
}
static int shutdown_cancel(void *pool) {
  return tko_pool_shutdown(pool, TKO_CANCEL);
}

static void shutdown_with_blocked(tko_shutdown_mode mode) {
  kctx c;
  kctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 1, 1000);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(tko_submit(pool, blocking_fn, &c, 0), 0);
  cr_assert(tt_count_wait_eq(&c.inside, 2));
  /* Both workers are blocked: these stay queued until shutdown. */
  for (int i = 0; i < 3; i++)
    cr_assert_eq(tko_submit(pool, plain_fn, &c, 0), 0);
  tf_thread t;
  cr_assert_eq(tf_thread_start(&t, mode == TKO_DRAIN ? shutdown_drain : shutdown_cancel, pool), 0);
  if (mode == TKO_CANCEL) cr_assert(tt_count_wait_eq(&c.cancels, 3));
  tf_wait_thread_sleeping(t.tid); /* best effort: shutdown waits for the workers */
  cr_assert_not(tf_thread_is_done(&t), "shutdown returned while tasks were blocked");
  cr_assert_eq(tt_count_get(&c.inside), 2);
  tt_gate_open(&c.gate);
  int rc = -1;
  cr_assert(tf_thread_join(&t, &rc));
  cr_assert_eq(rc, 0);
  long runs = tt_count_get(&c.runs), cancels = tt_count_get(&c.cancels);
  cr_assert_eq(runs + cancels, 5, "a task was lost");
  cr_assert_eq(runs, mode == TKO_DRAIN ? 5 : 2);
  tko_stats s = tf_stats(pool);
  cr_assert_eq(s.blocking, 0);
  cr_assert_eq(s.completed + s.cancelled, s.submitted);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
}

Test(blocking, shutdown_drain_waits_for_blocked_tasks) {
  shutdown_with_blocked(TKO_DRAIN);
}
Test(blocking, shutdown_cancel_waits_for_blocked_tasks) {
  shutdown_with_blocked(TKO_CANCEL);
}

/* ---- regressions: core bugs these tests found, now fixed ------------- */

/* stats.blocking is documented as "workers inside tko_blocking_begin/end
 * now", and calls nest; but the core counts calls, so one worker inside two
 * nested regions shows as two blocked workers. */
Test(blocking, regression_nested_regions_count_one_worker) {
  kctx c;
  kctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 0, 0);
  cr_assert_eq(tko_submit(pool, nested_fn, &c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&c.nested_seen), 1, "one worker counted as %u",
               atomic_load(&c.nested_seen));
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* Issue 14, defect 16: the depth leaked across tasks. A task that returned
 * inside its region left stats.blocking at 1 on an idle pool, and a later
 * task's tko_blocking_end without a begin returned 0 (ending a region that
 * was not its own). */
static int begin_and_return(void *arg) {
  if (tko_blocking_begin() != 0) atomic_fetch_add(&((kctx *)arg)->bad, 1);
  return 0;
}

static int unmatched_end(void *arg) {
  if (tko_blocking_end() != -EPERM) atomic_fetch_add(&((kctx *)arg)->bad, 1);
  return 0;
}

static bool none_blocking(const tko_stats *s) {
  return s->blocking == 0;
}

/* The worker ends a region its task left open after the task counts as
 * finished, so wait_idle can return before that: read until it shows. */
Test(blocking, a_region_ends_with_its_task) {
  kctx c;
  kctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 0, 0);
  cr_assert_eq(tko_submit(pool, begin_and_return, &c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  tko_stats s;
  cr_assert(tf_stats_wait(pool, &s, none_blocking), "the region outlived its task");
  cr_assert_eq(tko_submit(pool, unmatched_end, &c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&c.bad), 0, "an end without a begin was accepted");
  cr_assert_eq(tf_stats(pool).blocking, 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* Runs while its waiter helps, inside the waiter's region: that region is
 * not this task's to end. */
static int end_the_waiters_region(void *arg) {
  if (tko_blocking_end() != -EPERM) atomic_fetch_add(&((kctx *)arg)->bad, 1);
  return 0;
}

/* Runs while its waiter helps and returns inside a region of its own: that
 * region ends with it, the waiter's does not. */
static int begin_inside_the_waiters_region(void *arg) {
  if (tko_blocking_begin() != 0) atomic_fetch_add(&((kctx *)arg)->bad, 1);
  return 0;
}

static tko_task_fn helped_member; /* what begin_and_help's group runs */

/* Begins a region, then waits on a group whose member (helped_member) the
 * single worker runs while helping, then ends its own region. */
static int begin_and_help(void *arg) {
  kctx *c = arg;
  tko_group g;
  if (tko_group_init(&g) != 0 || tko_blocking_begin() != 0) {
    atomic_fetch_add(&c->bad, 1);
    return 0;
  }
  if (tko_group_submit(c->pool, &g, helped_member, c, 0) != 0 ||
      tko_group_wait(&g, -1) != 0)
    atomic_fetch_add(&c->bad, 1);
  atomic_store(&c->nested_seen, tf_stats(c->pool).blocking);
  if (tko_blocking_end() != 0) atomic_fetch_add(&c->bad, 1);
  tko_group_destroy(&g);
  return 0;
}

/* A task run inside a helping wait starts inside its waiter's region (its
 * base is the waiter's depth): its tko_blocking_end without a begin of its
 * own is -EPERM, and the waiter's region is still counted after it. */
Test(blocking, a_task_run_while_helping_cannot_end_its_waiters_region) {
  kctx c;
  kctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 0, 0);
  helped_member = end_the_waiters_region;
  cr_assert_eq(tko_submit(pool, begin_and_help, &c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&c.bad), 0, "a helped task ended its waiter's region");
  cr_assert_eq(atomic_load(&c.nested_seen), 1, "the waiter's region was not counted after it");
  cr_assert_eq(tf_stats(pool).blocking, 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* A task run inside a helping wait that returns inside a region of its own
 * ends that region only: the waiter's region is still counted after it,
 * and ends with the waiter's tko_blocking_end. */
Test(blocking, a_region_begun_while_helping_ends_with_its_task_only) {
  kctx c;
  kctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 0, 0);
  helped_member = begin_inside_the_waiters_region;
  cr_assert_eq(tko_submit(pool, begin_and_help, &c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&c.bad), 0);
  cr_assert_eq(atomic_load(&c.nested_seen), 1, "the helped task's return ended its waiter's region");
  cr_assert_eq(tf_stats(pool).blocking, 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TB_FORK_SKIP 1 /* fork with threads under a sanitizer: see test_process.c */
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define TB_FORK_SKIP 1
#endif
#endif

/* A task forks; the child (a copy of the worker thread) asks for the hint
 * and exits with 0 if it got -ECHILD. */
static int fork_and_begin(void *arg) {
  pid_t pid = fork();
  if (pid == 0)
    tt_child_exit(tko_blocking_begin() == -ECHILD && tko_blocking_end() == -ECHILD ? 0 : 1);
  int status = -1;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
    atomic_fetch_add(&((kctx *)arg)->bad, 1);
  return 0;
}

/* Issue 14, defect 13 (the hint's part): in a child forked from a task,
 * tko_blocking_begin returned 0 on the parent's pool. */
Test(blocking, the_hint_in_a_forked_child_is_echild) {
#ifdef TB_FORK_SKIP
  return;
#endif
  kctx c;
  kctx_init(&c);
  tko_pool *pool = make_pool(&c, 1, 0, 0);
  cr_assert_eq(tko_submit(pool, fork_and_begin, &c, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(atomic_load(&c.bad), 0, "the child's hint was not -ECHILD");
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* A task a full CALLER_RUNS queue runs on a worker's thread from its
 * thread_start hook - no task of the worker's own around it - and that
 * returns inside its region: the region ends with it, as a worker's own
 * task's does. The pool's one worker is pinned so that the hook's first
 * submit fills the queue and its second runs there, on the new worker. */
typedef struct hook_scene {
  _Atomic(tko_pool *) pool; /* set once the hook may submit */
  atomic_int begin_rc, submit_rc;
  tt_count hooked;
} hook_scene;

static int begin_here(void *arg) {
  atomic_store(&((hook_scene *)arg)->begin_rc, tko_blocking_begin());
  return 0;
}

static void submit_from_thread_start(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  (void)kind;
  hook_scene *h = user;
  tko_pool *pool = atomic_exchange(&h->pool, NULL);
  if (!pool) return;
  (void)tko_submit(pool, tt_nop_fn, NULL, 0); /* queued: the queue is full */
  atomic_store(&h->submit_rc, tko_submit(pool, begin_here, h, 0));
  tt_count_add(&h->hooked, 1);
}

Test(blocking, a_region_left_open_by_a_task_run_in_a_thread_hook_ends_with_it) {
  static hook_scene h;
  memset(&h, 0, sizeof h);
  atomic_store(&h.begin_rc, 1);
  atomic_store(&h.submit_rc, 1);
  tt_count_init(&h.hooked);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  o.hooks.thread_start = submit_from_thread_start;
  o.hooks.user = &h;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  static tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(pool, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  atomic_store(&h.pool, pool);
  cr_assert_eq(tko_pool_resize(pool, 2, 0), 0);
  cr_assert(tt_count_wait_geq(&h.hooked, 1), "the new worker's hook never ran");
  cr_assert_eq(atomic_load(&h.submit_rc), 0);
  cr_assert_eq(atomic_load(&h.begin_rc), 0, "a worker's thread may give the hint");
  cr_assert_eq(tf_stats(pool).blocking, 0, "the region outlived the task that began it");
  tt_gate_open(&pin.gate);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tf_stats(pool).blocking, 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

/* Keyed tasks of one lane run one after another in their runner, one pool
 * task: a region the first leaves open ends with it, so the second starts
 * outside any region - stats count no blocked worker, and its end without
 * a begin is refused. */
typedef struct keyed_regions {
  tko_pool *pool;
  atomic_int first_begin, second_end;
  atomic_uint blocking_seen;
} keyed_regions;

static int keyed_begin_and_return(void *arg) {
  atomic_store(&((keyed_regions *)arg)->first_begin, tko_blocking_begin());
  return 0;
}

static int keyed_look_and_end(void *arg) {
  keyed_regions *k = arg;
  atomic_store(&k->blocking_seen, tf_stats(k->pool).blocking);
  atomic_store(&k->second_end, tko_blocking_end());
  return 0;
}

Test(blocking, a_region_left_open_by_a_keyed_task_ends_before_the_next_of_its_lane) {
  static keyed_regions k;
  memset(&k, 0, sizeof k);
  atomic_store(&k.first_begin, 1);
  atomic_store(&k.second_end, 1);
  atomic_store(&k.blocking_seen, 99);
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&k.pool, &o), 0);
  cr_assert_eq(tko_pool_pause(k.pool), 0); /* both wait in the lane for one runner */
  cr_assert_eq(tko_submit_keyed(k.pool, 3, keyed_begin_and_return, &k, 0), 0);
  cr_assert_eq(tko_submit_keyed(k.pool, 3, keyed_look_and_end, &k, 0), 0);
  cr_assert_eq(tko_pool_resume(k.pool), 0);
  cr_assert_eq(tko_pool_wait_idle(k.pool, -1), 0);
  cr_assert_eq(atomic_load(&k.first_begin), 0);
  cr_assert_eq(atomic_load(&k.blocking_seen), 0, "the first task's region was still counted");
  cr_assert_eq(atomic_load(&k.second_end), -EPERM, "the next task ended another task's region");
  cr_assert_eq(tf_stats(k.pool).blocking, 0);
  cr_assert_eq(tko_pool_destroy(k.pool), 0);
}
