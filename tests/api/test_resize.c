/* SPDX-License-Identifier: MIT */
/* tko_pool_resize: growing starts every new worker at once (a rendezvous
 * of N tasks that needs N workers at the same time), shrinking retires
 * workers as they finish their current task - handing back the tasks they
 * had taken, in their order - and bounds how many tasks run at once;
 * resizes from inside a task; resizes racing submits and a shutdown (the
 * TSan case); a destroy racing resizes joins every thread; and the errors.
 * Every wait is bounded (tko_test_sync.h). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

/* Thread hooks, counted by worker kind. */
typedef struct watch {
  tt_count starts[2], stops[2];
} watch;

static void watch_init(watch *w) {
  for (int k = 0; k < 2; k++) {
    tt_count_init(&w->starts[k]);
    tt_count_init(&w->stops[k]);
  }
}

static void on_start(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  tt_count_add(&((watch *)user)->starts[kind], 1);
}

static void on_stop(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  tt_count_add(&((watch *)user)->stops[kind], 1);
}

/* Options with the hooks above; elastic workers never retire for idling
 * here (an hour), so every retirement the tests see is a shrink's. */
static tko_options watched(watch *w, unsigned workers, unsigned max_elastic, unsigned max_threads) {
  tko_options o = tko_elastic_options(workers, max_elastic, TKO_MAX_IDLE_MS);
  o.max_threads = max_threads;
  o.max_batch = 1; /* a worker never holds a rendezvous task it cannot start */
  o.hooks.user = w;
  o.hooks.thread_start = on_start;
  o.hooks.thread_stop = on_stop;
  return o;
}

/* N tasks that each wait until all N have started: they can only finish
 * with N workers running at once. */
typedef struct rendezvous {
  tt_count in;
  long need;
  atomic_int missed;
} rendezvous;

static int meet_fn(void *arg) {
  rendezvous *r = arg;
  tt_count_add(&r->in, 1);
  if (!tt_count_wait_geq(&r->in, r->need)) atomic_store(&r->missed, 1);
  return 0;
}

static void meet(tko_pool *p, long n) {
  rendezvous r;
  memset(&r, 0, sizeof r);
  tt_count_init(&r.in);
  r.need = n;
  for (long i = 0; i < n; i++)
    cr_assert_eq(tko_submit(p, meet_fn, &r, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS + 10000), 0);
  cr_assert_eq(atomic_load(&r.missed), 0, "%ld tasks never ran at once", n);
  tt_count_fini(&r.in);
}

/* Tasks that count how many of them run at once. */
typedef struct overlap {
  atomic_int now, max;
  atomic_long ran;
} overlap;

static int overlap_fn(void *arg) {
  overlap *o = arg;
  int n = atomic_fetch_add(&o->now, 1) + 1;
  int m = atomic_load(&o->max);
  while (n > m && !atomic_compare_exchange_weak(&o->max, &m, n)) {
  }
  tt_spin_ns(20000); /* long enough for the workers to overlap */
  atomic_fetch_sub(&o->now, 1);
  atomic_fetch_add(&o->ran, 1);
  return 0;
}

/* Runs n overlap tasks; returns the most that ran at once. */
static int most_at_once(tko_pool *p, long n) {
  overlap o;
  memset(&o, 0, sizeof o);
  for (long i = 0; i < n; i++)
    cr_assert_eq(tko_submit(p, overlap_fn, &o, (int)(i % 5)), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&o.ran), n);
  return atomic_load(&o.max);
}

Test(resize, grow_starts_every_worker_at_once) {
  watch w;
  watch_init(&w);
  tko_options o = watched(&w, 1, 0, 6);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_resize(p, 5, 0), 0);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.basic_workers, 5); /* counted before resize returns */
  cr_assert(tt_count_wait_geq(&w.starts[TKO_WORKER_BASIC], 5));
  meet(p, 5);
  cr_assert_eq(tko_pool_resize(p, 6, 0), 0); /* up to max_threads */
  meet(p, 6);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(tt_count_get(&w.stops[TKO_WORKER_BASIC]), 6);
}

/* What the ordered tasks of the next test record. */
typedef struct ordered {
  int idx, weight;
  atomic_int runs;
  atomic_uint worker;
} ordered;

static atomic_int order_pos;
static int order_log[64];

static int ordered_fn(void *arg) {
  ordered *t = arg;
  atomic_fetch_add(&t->runs, 1);
  order_log[atomic_fetch_add(&order_pos, 1)] = t->idx;
  return 0;
}

static void note_worker(void *user, const tko_task_info *info) {
  (void)user;
  if (info->fn == ordered_fn) atomic_store(&((ordered *)info->arg)->worker, info->worker);
}

/* Worker 1 takes a batch (a pin and 14 tasks behind it) while worker 0 is
 * pinned; the pool shrinks to one worker; worker 1 finishes its pin and
 * retires, handing the 14 back. Worker 0 then runs all 30 tasks, in weight
 * order, each once: the handed-back tasks went back ahead of the later
 * tasks of their weight, and worker 1 ran none of them. */
Test(resize, shrink_hands_back_the_batch_in_order) {
  watch w;
  watch_init(&w);
  tko_options o = watched(&w, 1, 0, 4);
  o.max_batch = 0; /* default: batches */
  o.hooks.before_run = note_worker;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tt_pin pin0 = TT_PIN_INIT, pin1 = TT_PIN_INIT;
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin0, 0), 0);
  cr_assert(tt_count_wait_geq(&pin0.started, 1));
  cr_assert_eq(tko_pool_resize(p, 2, 0), 0);
  cr_assert(tt_count_wait_geq(&w.starts[TKO_WORKER_BASIC], 2));

  enum { N = 30 };
  static ordered t[N];
  atomic_store(&order_pos, 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  cr_assert_eq(tko_submit(p, tt_pin_fn, &pin1, 100), 0);
  for (int i = 0; i < N; i++) {
    t[i] = (ordered){.idx = i, .weight = i % 3};
    atomic_store(&t[i].worker, 99);
    cr_assert_eq(tko_submit(p, ordered_fn, &t[i], t[i].weight), 0);
  }
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert(tt_count_wait_geq(&pin1.started, 1)); /* on worker 1: worker 0 is pinned */
  cr_assert_eq(tko_pool_resize(p, 1, 0), 0);
  tt_gate_open(&pin1.gate);
  cr_assert(tt_count_wait_geq(&w.stops[TKO_WORKER_BASIC], 1), "worker 1 did not retire");
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.basic_workers, 1);
  tt_gate_open(&pin0.gate);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);

  cr_assert_eq(atomic_load(&order_pos), N);
  int expect = 0;
  for (int weight = 2; weight >= 0; weight--)
    for (int i = weight; i < N; i += 3) {
      cr_assert_eq(order_log[expect], i, "position %d ran task %d, not %d", expect,
                   order_log[expect], i);
      expect++;
    }
  for (int i = 0; i < N; i++) {
    cr_assert_eq(atomic_load(&t[i].runs), 1);
    cr_assert_eq(atomic_load(&t[i].worker), 0, "task %d ran on worker %u", i,
                 atomic_load(&t[i].worker));
  }
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(resize, shrink_limits_how_many_run_at_once) {
  watch w;
  watch_init(&w);
  tko_options o = watched(&w, 4, 0, 4);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  meet(p, 4);
  /* Idle workers sleep: the shrink wakes them to retire. */
  cr_assert_eq(tko_pool_resize(p, 2, 0), 0);
  cr_assert(tt_count_wait_geq(&w.stops[TKO_WORKER_BASIC], 2), "idle workers did not retire");
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.basic_workers, 2);
  cr_assert_leq(most_at_once(p, TT_SCALE(200, 50)), 2);
  meet(p, 2);
  /* And back: the retired slots get new threads (their old ones joined). */
  cr_assert_eq(tko_pool_resize(p, 4, 0), 0);
  meet(p, 4);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(tt_count_get(&w.stops[TKO_WORKER_BASIC]), tt_count_get(&w.starts[TKO_WORKER_BASIC]));
}

Test(resize, lower_max_elastic_retires_busy_elastic_workers) {
  watch w;
  watch_init(&w);
  tko_options o = watched(&w, 1, 3, 4);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  tt_pin pin = TT_PIN_INIT;
  for (int i = 0; i < 4; i++)
    cr_assert_eq(tko_submit(p, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 4), "the pool did not grow to 4 workers");
  cr_assert_eq(tko_pool_resize(p, 1, 1), 0);
  tt_gate_open(&pin.gate);
  cr_assert(tt_count_wait_geq(&w.stops[TKO_WORKER_ELASTIC], 2), "elastic workers did not retire");
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.elastic_workers, 1);
  cr_assert_eq(s.elastic_spawned, s.elastic_retired + s.elastic_workers);
  cr_assert_leq(most_at_once(p, TT_SCALE(200, 50)), 2);
  /* Elastic-only: every basic worker retires, the elastic ones run it all. */
  cr_assert_eq(tko_pool_resize(p, 0, 2), 0);
  cr_assert(tt_count_wait_geq(&w.stops[TKO_WORKER_BASIC], 1));
  cr_assert_leq(most_at_once(p, TT_SCALE(200, 50)), 2);
  meet(p, 2);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* A basic worker whose thread_stop hook holds it (worker 1, once). */
typedef struct held_stop {
  watch w; /* first: the hooks' user is either */
  atomic_int held;
  tt_count in_stop;
  tt_gate release;
} held_stop;

static void held_on_stop(void *user, unsigned index, tko_worker_kind kind) {
  held_stop *h = user;
  on_stop(&h->w, index, kind);
  if (kind == TKO_WORKER_BASIC && index == 1 && !atomic_exchange(&h->held, 1)) {
    tt_count_add(&h->in_stop, 1);
    tt_gate_wait(&h->release);
  }
}

/* A grow that comes while a retired worker still runs its stop hook hands
 * the slot back to that thread, which starts over (a new thread_start). */
Test(resize, grow_during_a_retirement_keeps_the_worker) {
  held_stop h;
  memset(&h, 0, sizeof h);
  watch_init(&h.w);
  tt_count_init(&h.in_stop);
  pthread_mutex_init(&h.release.mu, NULL);
  pthread_cond_init(&h.release.cv, NULL);
  tko_options o = watched(&h.w, 2, 0, 2);
  o.hooks.thread_stop = held_on_stop;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  meet(p, 2);
  cr_assert_eq(tko_pool_resize(p, 1, 0), 0);
  cr_assert(tt_count_wait_geq(&h.in_stop, 1), "worker 1 did not retire");
  tko_stats s;
  tko_pool_stats(p, &s);
  cr_assert_eq(s.basic_workers, 1);
  cr_assert_eq(tko_pool_resize(p, 2, 0), 0);
  tko_pool_stats(p, &s);
  cr_assert_eq(s.basic_workers, 2);
  tt_gate_open(&h.release);
  cr_assert(tt_count_wait_geq(&h.w.starts[TKO_WORKER_BASIC], 3), "worker 1 did not start over");
  meet(p, 2);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(tt_count_get(&h.w.starts[TKO_WORKER_BASIC]), 3);
  cr_assert_eq(tt_count_get(&h.w.stops[TKO_WORKER_BASIC]), 3);
}

typedef struct resize_job {
  tko_pool *pool;
  unsigned basic, elastic;
  atomic_int rc;
} resize_job;

static int resize_fn(void *arg) {
  resize_job *j = arg;
  atomic_store(&j->rc, tko_pool_resize(j->pool, j->basic, j->elastic));
  return 0;
}

Test(resize, from_inside_a_task) {
  watch w;
  watch_init(&w);
  tko_options o = watched(&w, 1, 0, 4);
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  resize_job grow = {p, 3, 0, -1}, shrink = {p, 1, 0, -1};
  cr_assert_eq(tko_submit(p, resize_fn, &grow, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&grow.rc), 0);
  meet(p, 3);
  /* Whichever worker runs it, it may retire itself after this task. */
  cr_assert_eq(tko_submit(p, resize_fn, &shrink, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(p, TT_LONG_MS), 0);
  cr_assert_eq(atomic_load(&shrink.rc), 0);
  cr_assert(tt_count_wait_geq(&w.stops[TKO_WORKER_BASIC], 2));
  cr_assert_leq(most_at_once(p, TT_SCALE(100, 30)), 1);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

Test(resize, errors) {
  cr_assert_eq(tko_pool_resize(NULL, 1, 0), -EINVAL);
  tko_options o = tko_elastic_options(2, 2, 0);
  tko_pool *p;
  o.max_threads = 3; /* below workers + max_elastic */
  cr_assert_eq(tko_pool_create(&p, &o), -EINVAL);
  o.max_threads = TKO_MAX_WORKERS + TKO_MAX_ELASTIC + 1;
  cr_assert_eq(tko_pool_create(&p, &o), -EINVAL);
  o.max_threads = 5;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_resize(p, 0, 0), -EINVAL);
  cr_assert_eq(tko_pool_resize(p, 4, 2), -EINVAL); /* 6 > max_threads */
  cr_assert_eq(tko_pool_resize(p, TKO_MAX_WORKERS + 1, 0), -EINVAL);
  cr_assert_eq(tko_pool_resize(p, 0, TKO_MAX_ELASTIC + 1), -EINVAL);
  cr_assert_eq(tko_pool_resize(p, 5, 0), 0);
  cr_assert_eq(tko_pool_resize(p, 0, 5), 0);
  cr_assert_eq(tko_pool_resize(p, 1, 1), 0);
  cr_assert_eq(tko_pool_resize(p, 1, 1), 0); /* the same size: nothing to do */
  cr_assert_eq(tko_pool_shutdown(p, TKO_DRAIN), 0);
  cr_assert_eq(tko_pool_resize(p, 2, 0), -ESHUTDOWN);
  cr_assert_eq(tko_pool_destroy(p), 0);
  /* The default leaves room to grow to 4 threads per CPU: 4 at least. */
  o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_resize(p, 4, 0), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- racing: submitters, resizers, resizing tasks, a shutdown ---------- */

typedef struct race {
  tko_pool *pool;
  atomic_long accepted, ran;
  tt_count progress; /* one per 64 tasks accepted */
  atomic_int bad_rc;
  atomic_int starts, stops;
} race;

static void race_start(void *user, unsigned index, tko_worker_kind kind) {
  (void)index, (void)kind;
  atomic_fetch_add(&((race *)user)->starts, 1);
}

static void race_stop(void *user, unsigned index, tko_worker_kind kind) {
  (void)index, (void)kind;
  atomic_fetch_add(&((race *)user)->stops, 1);
}

static int race_task(void *arg) {
  atomic_fetch_add(&((race *)arg)->ran, 1);
  return 0;
}

static bool resize_ok(int rc) {
  return rc == 0 || rc == -ESHUTDOWN;
}

/* A size from a fixed sequence: 0..4 basic, 0..3 elastic, never both 0. */
static void next_size(uint64_t *seed, unsigned *basic, unsigned *elastic) {
  uint64_t r = tt_rand(seed);
  *basic = (unsigned)(r % 5);
  *elastic = (unsigned)((r >> 8) % 4);
  if (*basic + *elastic == 0) *basic = 1;
}

static int race_resize_task(void *arg) {
  race *r = arg;
  uint64_t seed = (uint64_t)atomic_fetch_add(&r->ran, 1) * 2654435761u + 1;
  unsigned b, e;
  next_size(&seed, &b, &e);
  if (!resize_ok(tko_pool_resize(r->pool, b, e))) atomic_store(&r->bad_rc, 1);
  return 0;
}

static void *race_submitter(void *arg) {
  race *r = arg;
  for (long i = 0;; i++) {
    /* One task in 64 resizes the pool from inside it. */
    int rc = tko_submit(r->pool, i % 64 == 63 ? race_resize_task : race_task, r, (int)(i % 7));
    if (rc == -ESHUTDOWN) break;
    if (rc) {
      atomic_store(&r->bad_rc, 1);
      break;
    }
    if (atomic_fetch_add(&r->accepted, 1) % 64 == 63) tt_count_add(&r->progress, 1);
  }
  return NULL;
}

static void *race_resizer(void *arg) {
  race *r = arg;
  uint64_t seed = (uint64_t)(uintptr_t)&seed | 1;
  for (;;) {
    unsigned b, e;
    next_size(&seed, &b, &e);
    int rc = tko_pool_resize(r->pool, b, e);
    if (rc == -ESHUTDOWN) break;
    if (rc) {
      atomic_store(&r->bad_rc, 1);
      break;
    }
    sched_yield(); /* let submits and workers in between resizes */
  }
  return NULL;
}

Test(resize, races_submits_resizes_and_shutdown, .timeout = 240) {
  int threads_before = tt_thread_count();
  for (int round = 0; round < TT_SCALE(12, 6); round++) {
    race r;
    memset(&r, 0, sizeof r);
    tt_count_init(&r.progress);
    tko_options o = tko_elastic_options(2, 2, 1); /* idle retirements race too */
    o.max_threads = 8;
    o.hooks.user = &r;
    o.hooks.thread_start = race_start;
    o.hooks.thread_stop = race_stop;
    cr_assert_eq(tko_pool_create(&r.pool, &o), 0);
    pthread_t sub[3], rsz[2];
    for (int i = 0; i < 3; i++)
      cr_assert_eq(pthread_create(&sub[i], NULL, race_submitter, &r), 0);
    for (int i = 0; i < 2; i++)
      cr_assert_eq(pthread_create(&rsz[i], NULL, race_resizer, &r), 0);
    cr_assert(tt_count_wait_geq(&r.progress, TT_SCALE(100, 30)));
    tko_shutdown_mode mode = round % 2 ? TKO_CANCEL : TKO_DRAIN;
    cr_assert_eq(tko_pool_shutdown(r.pool, mode), 0);
    for (int i = 0; i < 3; i++)
      pthread_join(sub[i], NULL);
    for (int i = 0; i < 2; i++)
      pthread_join(rsz[i], NULL);
    cr_assert_eq(atomic_load(&r.bad_rc), 0);
    tko_stats s;
    tko_pool_stats(r.pool, &s);
    long accepted = atomic_load(&r.accepted);
    cr_assert_eq(s.submitted, (uint64_t)accepted);
    cr_assert_eq(s.completed + s.cancelled, (uint64_t)accepted); /* each once */
    cr_assert_eq(s.completed, (uint64_t)atomic_load(&r.ran));
    if (mode == TKO_DRAIN) cr_assert_eq(s.cancelled, 0);
    cr_assert_eq(s.queued + s.running, 0);
    cr_assert_eq(tko_pool_destroy(r.pool), 0);
    cr_assert_eq(atomic_load(&r.starts), atomic_load(&r.stops));
    tt_count_fini(&r.progress);
  }
  /* Destroy joined every thread any resize started. */
  cr_assert_leq(tt_wait_thread_count_leq(threads_before), threads_before);
}

/* Found by the adversarial review of resize: after a shrink, a drain ran
 * the batches that retiring workers handed back on the thread that called
 * shutdown or destroy (its thread_start never ran; past a timed call's
 * deadline). Four workers each hold a batch, blocked in its first task; the
 * pool shrinks to one, the tasks are let go and the pool is drained: every
 * task runs on a worker. */
static _Thread_local bool dr_on_worker, dr_held;
static tt_count dr_held_count = TT_COUNT_INIT;
static tt_gate dr_gate = TT_GATE_INIT;
static atomic_int dr_off_worker, dr_ran;

static void dr_thread_start(void *user, unsigned index, tko_worker_kind kind) {
  (void)user, (void)index, (void)kind;
  dr_on_worker = true;
  dr_held = false;
}

static int dr_task(void *arg) {
  (void)arg;
  atomic_fetch_add(&dr_ran, 1);
  if (!dr_on_worker) atomic_fetch_add(&dr_off_worker, 1);
  if (dr_on_worker && !dr_held) { /* each worker's first task holds it */
    dr_held = true;
    tt_count_add(&dr_held_count, 1);
    tt_gate_wait(&dr_gate);
  }
  return 0;
}

Test(resize, a_drain_after_a_shrink_runs_every_task_on_a_worker) {
  enum { TASKS = 2000, ROUNDS = TT_SCALE(300, 40) };
  static tko_task ts[TASKS];
  for (int i = 0; i < TASKS; i++) ts[i] = (tko_task){dr_task, NULL, 0};
  for (int r = 0; r < ROUNDS; r++) {
    tt_count_fini(&dr_held_count);
    tt_count_init(&dr_held_count);
    dr_gate = (tt_gate)TT_GATE_INIT;
    atomic_store(&dr_off_worker, 0);
    atomic_store(&dr_ran, 0);
    tko_options o = tko_basic_options(4);
    o.hooks.thread_start = dr_thread_start;
    tko_pool *p;
    cr_assert_eq(tko_pool_create(&p, &o), 0);
    cr_assert_eq(tko_pool_pause(p), 0);
    cr_assert_eq(tko_submit_batch(p, ts, TASKS), 0);
    cr_assert_eq(tko_pool_resume(p), 0);
    cr_assert(tt_count_wait_geq(&dr_held_count, 4)); /* every worker holds a batch */
    cr_assert_eq(tko_pool_resize(p, 1, 0), 0);
    /* The drain begins before the held workers look at the new size. */
    cr_assert_eq(tko_pool_shutdown_timed(p, TKO_DRAIN, 0), -ETIMEDOUT);
    tt_gate_open(&dr_gate);
    if (r & 1) cr_assert_eq(tko_pool_shutdown_timed(p, TKO_DRAIN, TT_LONG_MS), 0);
    cr_assert_eq(tko_pool_destroy(p), 0);
    cr_assert_eq(atomic_load(&dr_ran), TASKS);
    cr_assert_eq(atomic_load(&dr_off_worker), 0, "round %d: %d tasks ran off the workers", r,
                 atomic_load(&dr_off_worker));
  }
}

/* ---- a destroy racing resizes leaves no thread behind ------------------ */

/* Each round lists the process's threads before the pool is created, then
 * destroys the pool while resizes race it - from other threads, from
 * tasks, from the thread hooks - and elastic workers spawn and retire under
 * submit bursts, and checks that destroy joined every thread the pool
 * started: once it returns, /proc lists no thread but those of the baseline
 * and the test's own helpers. Where helper threads call in, a lanes table
 * holds the pool, so destroy shuts it down and joins its threads but
 * returns -EBUSY without freeing it: the helpers may go on calling until
 * they see -ESHUTDOWN, which makes the race with destroy itself legal. The
 * self-driven rounds have no helpers: their tasks resubmit themselves, and
 * destroy frees the pool under them (ASan sees any thread that touched it
 * after). A thread destroy joined leaves /proc a moment after its join
 * returned (the kernel ends it after waking the joiner), so each check
 * re-reads until the list settles, within ~10 s. */

enum { GONE_EXTERNAL = 1, GONE_TASKS = 2, GONE_HOOKS = 4, GONE_CANCEL = 8, GONE_SELF = 16 };
enum { GONE_RESIZERS = 2, GONE_SUBMITTERS = 2, GONE_HELPERS = GONE_RESIZERS + GONE_SUBMITTERS };
enum { GONE_MAX_TIDS = 256, GONE_CHAINS = 32 };

typedef struct gone {
  tko_pool *pool;
  _Atomic(tko_pool *) hooked; /* the pool, for the hooks, once create returned */
  int flags;
  tt_count resizes; /* resizes that took effect, from anywhere */
  tt_count accepted;
  tt_count helpers_in; /* helpers that recorded their tid */
  pid_t helper_tid[GONE_HELPERS];
  atomic_int next_helper;
  atomic_int bad_rc;
  atomic_int starts, stops;
  atomic_uint hook_seed;
} gone;

/* Resizes p to a size drawn from seed; counts it if it took effect. */
static int gone_resize(gone *g, tko_pool *p, uint64_t *seed) {
  unsigned b, e;
  next_size(seed, &b, &e);
  int rc = tko_pool_resize(p, b, e);
  if (rc == 0) tt_count_add(&g->resizes, 1);
  else if (rc != -ESHUTDOWN) atomic_store(&g->bad_rc, rc);
  return rc;
}

static void gone_hook(gone *g) {
  tko_pool *p = atomic_load(&g->hooked); /* NULL while create runs */
  if (!(g->flags & GONE_HOOKS) || !p) return;
  uint64_t seed = (uint64_t)atomic_fetch_add(&g->hook_seed, 1) * 0x9E3779B97F4A7C15ull + 1;
  gone_resize(g, p, &seed);
}

static void gone_start(void *user, unsigned index, tko_worker_kind kind) {
  (void)index, (void)kind;
  atomic_fetch_add(&((gone *)user)->starts, 1);
  gone_hook(user);
}

static void gone_stop(void *user, unsigned index, tko_worker_kind kind) {
  (void)index, (void)kind;
  gone_hook(user);
  atomic_fetch_add(&((gone *)user)->stops, 1);
}

static int gone_resize_task(void *arg) {
  gone *g = arg;
  uint64_t seed = (uint64_t)tt_count_get(&g->accepted) * 2654435761u + 7;
  gone_resize(g, g->pool, &seed);
  return 0;
}

static int gone_spin_task(void *arg) {
  (void)arg;
  tt_spin_ns(2000); /* long enough for a burst to back up and spawn elastic workers */
  return 0;
}

/* A self-driven round's task: it submits its successor (until shutdown
 * refuses it), and one in 32 resizes first when the round resizes from
 * tasks. Submits from workers are what spawn elastic workers here. */
static int gone_chain_task(void *arg) {
  gone *g = arg;
  long n = tt_count_add(&g->accepted, 1);
  if ((g->flags & GONE_TASKS) && n % 32 == 31) gone_resize_task(g);
  else gone_spin_task(g);
  int rc = tko_submit(g->pool, gone_chain_task, g, (int)(n % 5));
  if (rc && rc != -ESHUTDOWN) atomic_store(&g->bad_rc, rc);
  return 0;
}

static void gone_helper_in(gone *g) {
  g->helper_tid[atomic_fetch_add(&g->next_helper, 1)] = tf_gettid();
  tt_count_add(&g->helpers_in, 1);
}

static void *gone_resizer(void *arg) {
  gone *g = arg;
  gone_helper_in(g);
  uint64_t seed = (uint64_t)(uintptr_t)&seed | 1;
  while (gone_resize(g, g->pool, &seed) == 0)
    sched_yield(); /* let submits and workers in between */
  return NULL;
}

/* Submits bursts (elastic workers spawn under them and retire between
 * them, elastic_idle_ms being 1), a resizing task in every burst when the
 * round resizes from tasks. */
static void *gone_submitter(void *arg) {
  gone *g = arg;
  gone_helper_in(g);
  for (long i = 0;; i++) {
    bool resize = (g->flags & GONE_TASKS) && i % 32 == 31;
    int rc = tko_submit(g->pool, resize ? gone_resize_task : gone_spin_task, g, (int)(i % 5));
    if (rc == -ESHUTDOWN) break;
    if (rc) {
      atomic_store(&g->bad_rc, rc);
      break;
    }
    tt_count_add(&g->accepted, 1);
    /* Between bursts the pool may go idle, and its elastic workers retire
     * as the next burst comes. */
    if (i % 64 == 63) tko_pool_wait_idle(g->pool, 100);
  }
  return NULL;
}

/* This process's thread ids (at most max); their number. */
static int gone_tids(pid_t *out, int max) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.' && n < max) out[n++] = (pid_t)atoi(e->d_name);
  closedir(d);
  return n;
}

static bool gone_listed(const pid_t *tids, int n, pid_t tid) {
  for (int i = 0; i < n; i++)
    if (tids[i] == tid) return true;
  return false;
}

/* What /proc says of thread tid: false if it is gone; else its name, its
 * state letter and whether the kernel is ending it (PF_EXITING in its
 * flags: it runs no user code any more - a thread destroy joined may still
 * be listed so for a moment, since the kernel wakes the joiner before it
 * lets go of the thread's memory map, which may wait for the map's lock). */
static bool gone_thread(pid_t tid, char comm[32], char *state, bool *exiting) {
  char path[64], stat[512];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  size_t n = fread(stat, 1, sizeof stat - 1, f);
  stat[n] = '\0';
  fclose(f);
  /* "tid (comm) state ppid pgrp session tty_nr tpgid flags ...": comm may
   * hold spaces or parentheses, so the fields start after the last ')'. */
  char *open = strchr(stat, '('), *p = strrchr(stat, ')');
  if (!open || !p || p[1] != ' ') return false;
  snprintf(comm, 32, "%.*s", (int)(p - open - 1), open + 1);
  *state = p[2];
  p += 2;
  for (int field = 3; field < 9 && p; field++) p = strchr(p + 1, ' ');
  *exiting = p && (strtoul(p + 1, NULL, 10) & 0x4u); /* PF_EXITING */
  return true;
}

/* The threads listed that are neither in keep nor helpers of g: their
 * number (-1 if /proc is unreadable), each as " tid:name:state" in names,
 * and in *running those not exiting. Re-reads until there are none, or ms
 * passed. */
static int gone_strangers_within(const pid_t *keep, int nkeep, const gone *g, char *names,
                                 size_t cap, long ms, int *running) {
  uint64_t end = tt_now_ns() + (uint64_t)ms * 1000000u;
  if (running) *running = 0;
  for (;;) {
    pid_t now[GONE_MAX_TIDS];
    int n = gone_tids(now, GONE_MAX_TIDS), strangers = 0;
    if (n < 0) return -1;
    size_t used = 0;
    names[0] = '\0';
    if (running) *running = 0;
    for (int i = 0; i < n; i++) {
      if (gone_listed(keep, nkeep, now[i])) continue;
      if (g && gone_listed(g->helper_tid, GONE_HELPERS, now[i])) continue;
      char comm[32], state;
      bool exiting;
      if (!gone_thread(now[i], comm, &state, &exiting)) continue; /* gone since the listing */
      strangers++;
      if (!exiting && running) ++*running;
      if (used < cap)
        used += (size_t)snprintf(names + used, cap - used, " %d:%s:%c%s", (int)now[i], comm, state,
                                 exiting ? "-exiting" : "");
    }
    if (strangers == 0 || tt_now_ns() >= end) return strangers;
    sched_yield();
  }
}

/* One round; the flags say which resizes race the destroy, keep lists the
 * baseline's threads (NULL: a warm-up, nothing checked). */
static void gone_round(int flags, const pid_t *keep, int nkeep, int round) {
  gone g;
  memset(&g, 0, sizeof g);
  tt_count_init(&g.resizes);
  tt_count_init(&g.accepted);
  tt_count_init(&g.helpers_in);
  g.flags = flags;
  tko_options o = tko_elastic_options(2, 2, 1);
  o.max_threads = 8;
  o.name = "gone";
  o.hooks.user = &g;
  o.hooks.thread_start = gone_start;
  o.hooks.thread_stop = gone_stop;
  cr_assert_eq(tko_pool_create(&g.pool, &o), 0);
  atomic_store(&g.hooked, g.pool);
  tko_lanes *l = NULL;
  pthread_t helper[GONE_HELPERS];
  int nhelpers = 0;
  if (flags & GONE_SELF) {
    for (int i = 0; i < GONE_CHAINS; i++)
      cr_assert_eq(tko_submit(g.pool, gone_chain_task, &g, i % 5), 0);
  } else {
    cr_assert_eq(tko_lanes_create(&l, g.pool, NULL), 0);
    for (int i = 0; i < GONE_SUBMITTERS; i++)
      cr_assert_eq(pthread_create(&helper[nhelpers++], NULL, gone_submitter, &g), 0);
    if (flags & GONE_EXTERNAL)
      for (int i = 0; i < GONE_RESIZERS; i++)
        cr_assert_eq(pthread_create(&helper[nhelpers++], NULL, gone_resizer, &g), 0);
  }
  cr_assert(tt_count_wait_geq(&g.helpers_in, nhelpers));
  cr_assert(tt_count_wait_geq(&g.accepted, 128));
  cr_assert(tt_count_wait_geq(&g.resizes, 2), "round %d: resizes did not take effect", round);
  if (flags & GONE_CANCEL) {
    int rc = tko_pool_shutdown_timed(g.pool, TKO_CANCEL, 0); /* destroy completes it */
    cr_assert(rc == 0 || rc == -ETIMEDOUT, "%s", tko_err_name(rc));
  }
  /* With the lanes: shut down, every thread joined, not freed. */
  cr_assert_eq(tko_pool_destroy(g.pool), l ? -EBUSY : 0);
  char names[512];
  if (keep) {
    /* Every thread destroy joined has ended its user code: one still
     * listed is one the kernel is ending. */
    int running;
    gone_strangers_within(keep, nkeep, &g, names, sizeof names, 0, &running);
    cr_assert_eq(running, 0, "round %d (flags %d): destroy returned while threads ran:%s", round,
                 flags, names);
    int strangers = gone_strangers_within(keep, nkeep, &g, names, sizeof names, 10000, NULL);
    cr_assert_eq(strangers, 0, "round %d (flags %d): %d thread(s) outlived destroy:%s", round,
                 flags, strangers, names);
  }
  for (int i = 0; i < nhelpers; i++)
    pthread_join(helper[i], NULL);
  int bad = atomic_load(&g.bad_rc);
  cr_assert_eq(bad, 0, "round %d: %s", round, tko_err_name(bad));
  cr_assert_eq(atomic_load(&g.starts), atomic_load(&g.stops), "round %d", round);
  if (l) {
    cr_assert_eq(tko_lanes_destroy(l), 0);
    cr_assert_eq(tko_pool_destroy(g.pool), 0);
  }
  if (keep) { /* the helpers are joined too: the baseline's threads only */
    int strangers = gone_strangers_within(keep, nkeep, NULL, names, sizeof names, 10000, NULL);
    cr_assert_eq(strangers, 0, "round %d (flags %d): %d thread(s) left:%s", round, flags,
                 strangers, names);
  }
  tt_count_fini(&g.resizes);
  tt_count_fini(&g.accepted);
  tt_count_fini(&g.helpers_in);
}

Test(resize, a_destroy_racing_resizes_joins_every_thread, .timeout = 240) {
  /* A first round starts whatever threads a runtime starts lazily (a
   * sanitizer's); the baseline is what is listed once its threads left. */
  pid_t keep[GONE_MAX_TIDS];
  int before = tt_thread_count();
  gone_round(GONE_EXTERNAL | GONE_TASKS | GONE_HOOKS, NULL, 0, -1);
  tt_wait_thread_count_leq_within(before, 1000);
  int nkeep = gone_tids(keep, GONE_MAX_TIDS);
  cr_assert_gt(nkeep, 0, "/proc/self/task is unreadable");
  cr_assert_leq(nkeep, before + 1, "the first round left %d threads", nkeep - before);
  /* 28 rounds: every mix of the three resize sources, with and without a
   * cancelling shutdown begun before the destroy, driven by helper threads
   * or by the tasks themselves. */
  for (int round = 0; round < TT_SCALE(84, 28); round++) {
    int flags = round % 7 + 1;
    if (round / 7 % 2) flags |= GONE_CANCEL;
    if (round / 14 % 2) /* no helpers: the tasks resize in place of the resizers */
      flags = (flags & ~GONE_EXTERNAL) | GONE_SELF | (flags & GONE_EXTERNAL ? GONE_TASKS : 0);
    gone_round(flags, keep, nkeep, round);
  }
}

/* A shrink retires sleeping workers at once, with no submit to wake them:
 * four basic workers, each seen asleep (its thread's tid, noted by its
 * thread_start hook), then a shrink to one; three thread_stop hooks must
 * run with nothing more submitted. */
static pid_t sleeper_tids[4];
static tt_count sleepers_started;

static void note_tid(void *user, unsigned index, tko_worker_kind kind) {
  (void)user, (void)kind;
  if (index < 4) sleeper_tids[index] = tf_gettid();
  tt_count_add(&sleepers_started, 1);
}

static tt_count sleepers_stopped;

static void count_stop(void *user, unsigned index, tko_worker_kind kind) {
  (void)user, (void)index, (void)kind;
  tt_count_add(&sleepers_stopped, 1);
}

static bool one_basic_worker(const tko_stats *s) { return s->basic_workers == 1; }

Test(resize, shrink_retires_sleeping_workers_without_a_submit) {
  tt_count_init(&sleepers_started);
  tt_count_init(&sleepers_stopped);
  tko_options o = tko_basic_options(4);
  o.hooks.thread_start = note_tid;
  o.hooks.thread_stop = count_stop;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert(tt_count_wait_eq(&sleepers_started, 4));
  for (int i = 0; i < 4; i++) cr_assert(tf_wait_thread_sleeping(sleeper_tids[i]));
  cr_assert_eq(tko_pool_resize(p, 1, 0), 0);
  cr_assert(tt_count_wait_geq_within(&sleepers_stopped, 3, 20000),
            "%ld of 3 sleeping workers retired",
            tt_count_get(&sleepers_stopped));
  tko_stats s;
  cr_assert(tf_stats_wait(p, &s, one_basic_worker), "%u basic workers", s.basic_workers);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(tt_count_get(&sleepers_stopped), 4);
  tt_count_fini(&sleepers_started);
  tt_count_fini(&sleepers_stopped);
}
