/* SPDX-License-Identifier: MIT */
/* Lane tables made with tko_lanes_create (taskorch/lanes.h), where their
 * runners meet the pool: issue 17's defects 6 and 7 as they held for these
 * tables after the pool's own keyed table was fixed, and issue 14's defect
 * 18 for lane rings.
 * - Different keys run in parallel whatever the workers' take size: a
 *   runner not yet started stays available to an idle worker.
 * - A TKO_FULL_CALLER_RUNS submitter runs its own task at most, not the
 *   tasks others append to its lane meanwhile.
 * - A ring grown by a burst goes back to its first size once it drains.
 * - A hook around a runner that the pool runs on its submitter's thread
 *   may submit to that very lane: no lane lock is held around it. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <taskorch.h>
#include <taskorch/lanes.h>

#include "tko_test.h"
#include "tko_test_sync.h"

#define LTB_WAIT_MS 10000L

/* Two keys on different lanes of a default table. */
static void two_lanes(tko_lanes *l, uint64_t *a, uint64_t *b) {
  *a = 1;
  *b = 2;
  while (tko_lanes_index(l, *b) == tko_lanes_index(l, *a)) (*b)++;
}

typedef struct meet {
  tt_count started;
  atomic_int missed; /* a task that never saw the other's start */
} meet;

static meet meet_;

/* Blocks until two meet tasks have started (a bounded rendezvous). */
static int meet_task(void *arg) {
  meet *m = arg;
  tt_count_add(&m->started, 1);
  if (!tt_count_wait_geq_within(&m->started, 2, LTB_WAIT_MS)) atomic_fetch_add(&m->missed, 1);
  return 0;
}

/* Empty tasks by the thousand: the workers' takes grow to their cap, so
 * that a worker would take two runners in one batch if it could. */
static void grow_takes(tko_pool *p) {
  for (int i = 0; i < 5000; i++) cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
}

/* ---- issue 17, defect 6, for user tables ----------------------------------- */

Test(lane_tables, different_keys_run_in_parallel_whatever_the_take_size) {
  meet *m = &meet_;
  tko_options o = tko_basic_options(2);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  uint64_t ka, kb;
  two_lanes(l, &ka, &kb);
  for (int round = 0; round < 20; round++) {
    grow_takes(p);
    memset(m, 0, sizeof *m);
    tt_count_init(&m->started);
    /* Both runners queued at once, ahead of a few plain tasks. */
    cr_assert_eq(tko_pool_pause(p), 0);
    cr_assert_eq(tko_lanes_submit(l, ka, meet_task, m, 5), 0);
    cr_assert_eq(tko_lanes_submit(l, kb, meet_task, m, 5), 0);
    for (int i = 0; i < 4; i++) cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
    cr_assert_eq(tko_pool_resume(p), 0);
    cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&m->missed), 0, "round %d: one key waited behind the other", round);
    tt_count_fini(&m->started);
  }
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* A runner and a plain task never share a take: a plain task queued behind
 * a runner (even rounds) or before it (odd rounds) meets the lane's task. */
Test(lane_tables, a_runner_is_taken_alone) {
  meet *m = &meet_;
  tko_options o = tko_basic_options(2);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, NULL), 0);
  for (int round = 0; round < 20; round++) {
    grow_takes(p);
    memset(m, 0, sizeof *m);
    tt_count_init(&m->started);
    cr_assert_eq(tko_pool_pause(p), 0);
    int plain_weight = round % 2 ? 6 : 4; /* before or after the runner (5) */
    cr_assert_eq(tko_lanes_submit(l, 3, meet_task, m, 5), 0);
    cr_assert_eq(tko_submit(p, meet_task, m, plain_weight), 0);
    for (int i = 0; i < 4; i++) cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
    cr_assert_eq(tko_pool_resume(p), 0);
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&m->missed), 0, "round %d: a runner shared a take", round);
    tt_count_fini(&m->started);
  }
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- issue 17, defect 7, for user tables ----------------------------------- */

typedef struct appender {
  tko_lanes *l;
  pthread_t submitter;
  tt_pin *pin; /* the worker's pin, released once the tasks are appended */
  atomic_int on_submitter, elsewhere;
} appender;

static int where_task(void *arg) {
  appender *a = arg;
  if (pthread_equal(pthread_self(), a->submitter)) atomic_fetch_add(&a->on_submitter, 1);
  else atomic_fetch_add(&a->elsewhere, 1);
  return 0;
}

enum { APPENDED = 3 };

/* The caller-run task: others append to its lane while it runs; then the
 * pool's only worker is released so that room appears. */
static int append_task(void *arg) {
  appender *a = arg;
  where_task(a);
  for (int i = 0; i < APPENDED; i++) cr_assert_eq(tko_lanes_submit(a->l, 7, where_task, a, 0), 0);
  tt_gate_open(&a->pin->gate);
  return 0;
}

Test(lane_tables, a_caller_runs_submitter_runs_only_its_own_task) {
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  appender a = {.submitter = pthread_self()};
  cr_assert_eq(tko_lanes_create(&a.l, p, NULL), 0);
  tt_pin pin = TT_PIN_INIT;
  a.pin = &pin;
  /* Pin the only worker, then fill the one queue slot. */
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  cr_assert_eq(tko_submit(p, tt_nop_fn, NULL, 0), 0);
  /* The runner cannot be queued: this thread runs the lane's one task,
   * which appends three more; those go to the pool once room appears. */
  cr_assert_eq(tko_lanes_submit(a.l, 7, append_task, &a, 0), 0);
  cr_assert_eq(tko_lanes_wait_idle(a.l, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&a.on_submitter), 1, "the submitter ran others' tasks");
  cr_assert_eq(atomic_load(&a.elsewhere), APPENDED);
  cr_assert_eq(tko_lanes_destroy(a.l), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- hooks around a lane run on its submitter's thread -------------------- */

/* A before_run hook that submits to the lane once it is armed. The pool
 * runs a caller-run lane's runner through its hooks; the hook must find the
 * lane unlocked (hooks never run under a library lock), so that its submit
 * returns instead of waiting for a mutex its own thread holds. */
typedef struct hook_scene {
  tko_pool *p;
  tko_lanes *l;
  tt_pin pin;
  atomic_int armed;   /* the next before_run call submits to the lane */
  atomic_int hook_rc; /* what that submit returned */
  tt_count hooked;    /* 1 once the hook's submit returned */
  tt_count ran;       /* lane tasks run */
  atomic_int order_ok; /* the lane's tasks ran in submit order */
  int submit_rc;      /* the scene's own submit */
} hook_scene;

/* A lane task's arg is its place in the lane's order (1, 2). */
static hook_scene hook_scene_;

static int hook_lane_task(void *arg) {
  long want = (long)(intptr_t)arg;
  if (tt_count_add(&hook_scene_.ran, 1) != want) atomic_store(&hook_scene_.order_ok, 0);
  return 0;
}

static void submitting_hook(void *user, const tko_task_info *task) {
  (void)task;
  hook_scene *s = user;
  if (!atomic_exchange(&s->armed, 0)) return;
  atomic_store(&s->hook_rc, tko_lanes_submit(s->l, 7, hook_lane_task, (void *)(intptr_t)2, 0));
  tt_count_add(&s->hooked, 1);
}

/* The submit whose runner the pool cannot queue: from a worker it fills
 * the queue's one slot first (the pool then runs the runner on that worker). */
static int hook_scene_submit(void *arg) {
  hook_scene *s = arg;
  if (tko_pool_wait_idle(s->p, 0) == -EDEADLK) /* on the worker */
    cr_assert_eq(tko_submit(s->p, tt_nop_fn, NULL, 0), 0);
  atomic_store(&s->armed, 1);
  s->submit_rc = tko_lanes_submit(s->l, 7, hook_lane_task, (void *)(intptr_t)1, 0);
  return 0;
}

static void *hook_scene_thread(void *arg) {
  hook_scene_submit(arg);
  return NULL;
}

static void hook_submits_to_a_caller_run_lane(bool on_worker) {
  hook_scene *s = &hook_scene_;
  memset(s, 0, sizeof *s);
  s->pin = (tt_pin)TT_PIN_INIT;
  tt_count_init(&s->hooked);
  tt_count_init(&s->ran);
  atomic_init(&s->order_ok, 1);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = TKO_FULL_CALLER_RUNS;
  o.hooks.before_run = submitting_hook;
  o.hooks.user = s;
  cr_assert_eq(tko_pool_create(&s->p, &o), 0);
  cr_assert_eq(tko_lanes_create(&s->l, s->p, NULL), 0);
  pthread_t th;
  if (on_worker) {
    cr_assert_eq(tko_submit(s->p, hook_scene_submit, s, 0), 0);
  } else {
    /* Pin the only worker, fill the one queue slot, then submit from a
     * thread of its own: a hang there is a failed wait here. */
    cr_assert_eq(tko_submit(s->p, tt_pin_fn, &s->pin, 0), 0);
    cr_assert(tt_count_wait_geq(&s->pin.started, 1));
    cr_assert_eq(tko_submit(s->p, tt_nop_fn, NULL, 0), 0);
    cr_assert_eq(pthread_create(&th, NULL, hook_scene_thread, s), 0);
  }
  /* A bound on a hang, not a timing: the hook's submit waits forever on a
   * lane mutex held by its own thread if the runner ran under it. */
  cr_assert(tt_count_wait_geq_within(&s->hooked, 1, 30000),
            "the hook's submit to the lane its thread was running never returned");
  cr_assert_eq(atomic_load(&s->hook_rc), 0);
  tt_gate_open(&s->pin.gate);
  if (!on_worker) cr_assert_eq(pthread_join(th, NULL), 0);
  cr_assert_eq(tko_lanes_wait_idle(s->l, 30000), 0);
  cr_assert_eq(tko_pool_wait_idle(s->p, 30000), 0);
  cr_assert_eq(s->submit_rc, 0);
  cr_assert_eq(tt_count_get(&s->ran), 2);
  cr_assert(atomic_load(&s->order_ok), "the lane's tasks ran out of submit order");
  cr_assert_eq(tko_lanes_destroy(s->l), 0);
  cr_assert_eq(tko_pool_destroy(s->p), 0);
  tt_count_fini(&s->hooked);
  tt_count_fini(&s->ran);
}

Test(lane_tables, a_hook_may_submit_to_the_lane_a_caller_runs_submitter_runs) {
  hook_submits_to_a_caller_run_lane(false);
}

Test(lane_tables, a_hook_may_submit_to_the_lane_a_caller_runs_worker_runs) {
  hook_submits_to_a_caller_run_lane(true);
}

/* ---- issue 14, defect 18, for lane rings ----------------------------------- */

/* An allocator that counts the bytes it has handed out and not had back. */
typedef struct byte_counter {
  atomic_long live;
  tko_allocator al;
} byte_counter;

typedef struct { size_t size; max_align_t align; } block_head;

static void *bc_alloc(void *ctx, size_t size) {
  block_head *h = malloc(sizeof *h + size);
  if (!h) return NULL;
  h->size = size;
  atomic_fetch_add(&((byte_counter *)ctx)->live, (long)size);
  return h + 1;
}

static void bc_free(void *ctx, void *p) {
  if (!p) return;
  block_head *h = (block_head *)p - 1;
  atomic_fetch_sub(&((byte_counter *)ctx)->live, (long)h->size);
  free(h);
}

static void *bc_realloc(void *ctx, void *p, size_t size) {
  void *q = bc_alloc(ctx, size);
  if (q && p) {
    size_t old = ((block_head *)p - 1)->size;
    memcpy(q, p, old < size ? old : size);
    bc_free(ctx, p);
  }
  return q;
}

Test(lane_tables, a_ring_grown_by_a_burst_shrinks_once_it_drains) {
  enum { BURST = 20000 };
  byte_counter bc = {.live = 0};
  bc.al = (tko_allocator){bc_alloc, bc_realloc, bc_free, &bc};
  tko_options o = tko_basic_options(1);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tko_lane_options lo = tko_lane_default_options();
  lo.allocator = &bc.al;
  tko_lanes *l;
  cr_assert_eq(tko_lanes_create(&l, p, &lo), 0);
  /* The lane's first use allocates its ring and scratch: the baseline. */
  cr_assert_eq(tko_lanes_submit(l, 9, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
  long base = atomic_load(&bc.live);
  for (int round = 0; round < 2; round++) {
    cr_assert_eq(tko_pool_pause(p), 0); /* the burst queues up in one ring */
    for (int i = 0; i < BURST; i++) cr_assert_eq(tko_lanes_submit(l, 9, tt_nop_fn, NULL, 0), 0);
    long peak = atomic_load(&bc.live);
    cr_assert_gt(peak, base + (long)(BURST * sizeof(tko_lane_task)) / 2);
    cr_assert_eq(tko_pool_resume(p), 0);
    cr_assert_eq(tko_lanes_wait_idle(l, TT_LONG_MS), 0);
    /* The drained lane's runner gave the big ring back before it left. */
    cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
    cr_assert_eq(atomic_load(&bc.live), base, "round %d: the burst's ring stayed", round);
  }
  tko_lane_stats st;
  tko_lanes_stats(l, &st);
  cr_assert_eq(st.completed, 1 + 2 * BURST);
  cr_assert_eq(st.lanes_used, 1);
  cr_assert_eq(tko_lanes_destroy(l), 0);
  cr_assert_eq(atomic_load(&bc.live), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- a lane run on its submitter's thread, and the pool's shutdown --------- */

/* A lane submit that cannot queue its runner (a full queue) may end up
 * running the lane on its own thread: a TKO_FULL_CALLER_RUNS submit runs
 * its task, and a TKO_FULL_BLOCK submit that the shutdown wakes runs the
 * lane itself. The shutdown must not return while that thread still runs
 * a lane task (attack_lanes2/all_attached_timed_then_cancel saw a lane
 * still queued after the shutdown had returned: the coalescer's thread,
 * blocked in a lane submit, ran it afterwards). */
typedef struct late_lane {
  tko_pool *p;
  tko_lanes *l;
  tt_count started;
  atomic_int finished;
  bool reenter;         /* the task calls the pool's shutdown and destroy */
  int shutdown_rc, destroy_rc;
} late_lane;

static int late_task(void *arg) {
  late_lane *s = arg;
  tt_count_add(&s->started, 1);
  if (s->reenter) {
    /* Bounded, so that a pool that waited for this very thread would show
     * -ETIMEDOUT here rather than hang the test. */
    s->shutdown_rc = tko_pool_shutdown_timed(s->p, TKO_DRAIN, 1000);
    s->destroy_rc = tko_pool_destroy(s->p);
  }
  struct timespec ts = {0, 100 * 1000 * 1000}; /* a long task: 100 ms */
  nanosleep(&ts, NULL);
  atomic_store(&s->finished, 1);
  return 0;
}

static void *late_submitter(void *arg) {
  late_lane *s = arg;
  cr_assert_eq(tko_lanes_submit(s->l, 7, late_task, s, 0), 0);
  return NULL;
}

/* A paused one-worker pool whose one queue slot is taken: a lane submit's
 * runner finds no room. */
static void full_paused_pool(late_lane *s, tko_full_policy policy) {
  memset(s, 0, sizeof *s);
  tt_count_init(&s->started);
  tko_options o = tko_basic_options(1);
  o.queue_capacity = 1;
  o.full_policy = policy;
  cr_assert_eq(tko_pool_create(&s->p, &o), 0);
  cr_assert_eq(tko_lanes_create(&s->l, s->p, NULL), 0);
  cr_assert_eq(tko_pool_pause(s->p), 0);
  cr_assert_eq(tko_submit(s->p, tt_nop_fn, NULL, 0), 0);
}

/* Starts a thread whose lane submit waits for room (TKO_FULL_BLOCK), and
 * returns once its task is accepted (the lane counts it submitted). */
static pthread_t start_blocked_submit(late_lane *s) {
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, late_submitter, s), 0);
  tko_lane_stats ls = {0};
  uint64_t end = tt_now_ns() + (uint64_t)TT_LONG_MS * 1000000u;
  while (ls.submitted == 0 && tt_now_ns() < end) {
    sched_yield();
    tko_lanes_stats(s->l, &ls);
  }
  cr_assert_eq(ls.submitted, 1, "the lane submit never got its task accepted");
  return th;
}

/* Joins the submitting thread (if any), then frees the lanes and the pool. */
static void late_lane_end(late_lane *s, const pthread_t *th) {
  if (th) cr_assert_eq(pthread_join(*th, NULL), 0);
  cr_assert_eq(tko_lanes_destroy(s->l), 0);
  cr_assert_eq(tko_pool_destroy(s->p), 0);
  tt_count_fini(&s->started);
}

/* A thread's lane submit runs its lane (TKO_FULL_BLOCK: once the shutdown
 * wakes it; TKO_FULL_CALLER_RUNS: at once), and the pool's shutdown then
 * returns only after the lane task. With reenter, that task's own
 * shutdown and destroy are -EDEADLK. */
static void shutdown_meets_a_lane_run_by_its_submitter(tko_full_policy policy, bool reenter) {
  late_lane *s = &(late_lane){0};
  full_paused_pool(s, policy);
  s->reenter = reenter;
  pthread_t th;
  if (policy == TKO_FULL_BLOCK) {
    th = start_blocked_submit(s); /* the shutdown unpauses the pool and wakes it */
  } else {
    cr_assert_eq(pthread_create(&th, NULL, late_submitter, s), 0);
    cr_assert(tt_count_wait_geq(&s->started, 1));
  }
  cr_assert_eq(tko_pool_shutdown(s->p, TKO_DRAIN), 0);
  cr_assert_eq(atomic_load(&s->finished), 1, "shutdown returned while the lane task ran");
  late_lane_end(s, &th);
  if (reenter) {
    cr_assert_eq(s->shutdown_rc, -EDEADLK);
    cr_assert_eq(s->destroy_rc, -EDEADLK);
  }
}

Test(lane_tables, shutdown_waits_for_a_blocked_submit_that_runs_its_lane) {
  shutdown_meets_a_lane_run_by_its_submitter(TKO_FULL_BLOCK, false);
}

Test(lane_tables, shutdown_waits_for_a_caller_run_lane_task) {
  shutdown_meets_a_lane_run_by_its_submitter(TKO_FULL_CALLER_RUNS, false);
}

/* Such a lane task that shuts the pool down would wait for its own
 * thread: -EDEADLK, for shutdown and destroy alike. */
Test(lane_tables, a_lane_task_on_its_submitter_cannot_shut_the_pool_down) {
  shutdown_meets_a_lane_run_by_its_submitter(TKO_FULL_BLOCK, true);
}

/* The same with no shutdown under way: the caller-run task's destroy
 * would wait for the task itself. */
Test(lane_tables, a_caller_run_lane_task_cannot_destroy_the_pool) {
  late_lane *s = &(late_lane){0};
  full_paused_pool(s, TKO_FULL_CALLER_RUNS);
  s->reenter = true;
  cr_assert_eq(tko_lanes_submit(s->l, 7, late_task, s, 0), 0);
  cr_assert_eq(s->shutdown_rc, -EDEADLK);
  cr_assert_eq(s->destroy_rc, -EDEADLK);
  cr_assert_eq(tko_pool_resume(s->p), 0);
  late_lane_end(s, NULL);
}
