/* SPDX-License-Identifier: MIT */
/* Several weighted queues (taskorch.h: tko_options.queues): every queue is
 * reached by the pool-wide paths (a worker whose own queue is empty, group
 * cancel, shutdown), and the priority contract holds across queues - a
 * heavy task on a queue whose worker is busy is started by another worker
 * within the recheck period, not after that worker's own backlog.
 * Each submitting thread's tasks go to one queue: the tests submit from
 * several threads so that every queue holds some. Public API only. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

enum { QUEUES = 4, PER_THREAD = 500 };

static tko_pool *make_pool(unsigned workers, unsigned queues, bool paused) {
  tko_options o = tko_basic_options(workers);
  o.queues = queues;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  if (paused) cr_assert_eq(tko_pool_pause(p), 0);
  return p;
}

Test(queues, more_than_the_limit_is_einval) {
  tko_options o = tko_basic_options(2);
  o.queues = TKO_MAX_QUEUES + 1;
  tko_pool *p = NULL;
  cr_assert_eq(tko_pool_create(&p, &o), -EINVAL);
  cr_assert_null(p);
  o.queues = TKO_MAX_QUEUES; /* cut to the workers */
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- submitting from several threads ------------------------------- */

static atomic_long ran;

static int count_run(void *arg) {
  (void)arg;
  atomic_fetch_add(&ran, 1);
  return 0;
}

typedef struct submitter {
  tko_pool *pool;
  tko_group *group; /* NULL: plain submits */
  int rc;
} submitter;

static int submit_many(void *arg) {
  submitter *s = arg;
  for (int i = 0; i < PER_THREAD && s->rc == 0; i++)
    s->rc = s->group ? tko_group_submit(s->pool, s->group, count_run, NULL, i % 3)
                     : tko_submit(s->pool, count_run, NULL, i % 3);
  return 0;
}

/* QUEUES threads submit PER_THREAD tasks each (one thread per queue). */
static void submit_from_threads(tko_pool *p, tko_group *g) {
  tf_thread t[QUEUES];
  submitter s[QUEUES];
  for (int i = 0; i < QUEUES; i++) {
    s[i] = (submitter){p, g, 0};
    cr_assert_eq(tf_thread_start(&t[i], submit_many, &s[i]), 0);
  }
  for (int i = 0; i < QUEUES; i++) {
    cr_assert(tf_thread_join(&t[i], NULL));
    cr_assert_eq(s[i].rc, 0);
  }
}

/* One worker left for four queues: it takes from the queues that have none
 * of their own - also right after a burst, before its next look at every
 * queue is due (rounds: some start while it is still busy). */
Test(queues, a_worker_takes_from_queues_that_have_no_worker) {
  atomic_store(&ran, 0);
  tko_pool *p = make_pool(QUEUES, QUEUES, false);
  cr_assert_eq(tko_pool_resize(p, 1, 0), 0);
  enum { ROUNDS = 10 };
  for (int round = 0; round < ROUNDS; round++) {
    submit_from_threads(p, NULL);
    cr_assert_eq(tko_pool_wait_idle(p, 20000), 0,
                 "round %d: tasks on a queue without a worker never ran", round);
  }
  cr_assert_eq(atomic_load(&ran), (long)ROUNDS * QUEUES * PER_THREAD);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

static atomic_long cancelled;

static void count_cancel(void *user, const tko_task_info *t) {
  (void)user, (void)t;
  atomic_fetch_add(&cancelled, 1);
}

Test(queues, a_group_cancel_reaches_every_queue) {
  atomic_store(&ran, 0);
  tko_pool *p = make_pool(QUEUES, QUEUES, true);
  tko_group g;
  cr_assert_eq(tko_group_init(&g), 0);
  submit_from_threads(p, &g);
  cr_assert_eq(tko_group_cancel(&g), (long)QUEUES * PER_THREAD);
  cr_assert_eq(tko_group_pending(&g), 0);
  cr_assert_eq(tko_pool_resume(p), 0);
  cr_assert_eq(tko_group_wait(&g, 0), 0);
  cr_assert_eq(tko_group_status(&g), -ECANCELED);
  cr_assert_eq(tko_group_destroy(&g), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
  cr_assert_eq(atomic_load(&ran), 0);
}

Test(queues, a_cancelling_shutdown_cancels_every_queue) {
  atomic_store(&ran, 0);
  atomic_store(&cancelled, 0);
  tko_options o = tko_basic_options(QUEUES);
  o.queues = QUEUES;
  o.hooks.on_cancel = count_cancel;
  tko_pool *p;
  cr_assert_eq(tko_pool_create(&p, &o), 0);
  cr_assert_eq(tko_pool_pause(p), 0);
  submit_from_threads(p, NULL);
  cr_assert_eq(tko_pool_shutdown(p, TKO_CANCEL), 0);
  cr_assert_eq(atomic_load(&cancelled), (long)QUEUES * PER_THREAD);
  cr_assert_eq(atomic_load(&ran), 0);
  cr_assert_eq(tko_pool_destroy(p), 0);
}

/* ---- priority across queues ------------------------------------------
 *
 * Two workers, two queues. A blocker task holds one worker; the other works
 * through light tasks of 20 us (a length of task, not a wait). Heavy tasks
 * submitted from other threads note how many light tasks started between
 * their submit's return and their own start: the contract bounds that by
 * the recheck period (100 us: about five light tasks) plus the batch the
 * worker held; without looking across queues it is the free worker's
 * whole light backlog (LIGHTS). The placement is taskorch.h's
 * (tko_options.queues): the k-th thread to submit uses queue k mod 2 (this
 * thread, submitting first, queue 0), and basic worker i's own is queue i;
 * a before_run hook tells which worker the blocker holds. */

enum { LIGHT_NS = 20000, LIGHTS = 2000, BOUND = 100 };

static tt_count light_starts;
static tt_gate blocker_gate = TT_GATE_INIT;
static tt_count lights_in;
static tt_gate lights_leave = TT_GATE_INIT;
static tt_count blocker_in;
static atomic_int blocker_worker;

static int blocker(void *arg) {
  (void)arg;
  tt_count_add(&blocker_in, 1);
  cr_assert(tt_gate_wait(&blocker_gate));
  return 0;
}

static void note_blocker_worker(void *user, const tko_task_info *t) {
  (void)user;
  if (t->fn == blocker) atomic_store(&blocker_worker, (int)t->worker);
}

static int light(void *arg) {
  (void)arg;
  tt_count_add(&light_starts, 1);
  uint64_t until = tt_now_ns() + LIGHT_NS;
  while (tt_now_ns() < until) {
  }
  return 0;
}

typedef struct heavy_probe {
  tko_pool *pool;
  int (*submit)(void *); /* scene_heavy's */
  long at_submit, at_start;
  tt_count started;
} heavy_probe;

static int heavy(void *arg) {
  heavy_probe *h = arg;
  h->at_start = tt_count_get(&light_starts);
  tt_count_add(&h->started, 1);
  return 0;
}

static int submit_heavy(void *arg) {
  heavy_probe *h = arg;
  int rc = tko_submit(h->pool, heavy, h, 9);
  /* After the submit returned: the contract's starting point. The heavy
   * task's start, which reads the count too, is ordered after this only by
   * the pool; the test waits for it before it reads at_start. */
  h->at_submit = tt_count_get(&light_starts);
  return rc;
}

/* A light submitter stays alive until the scene ends, so that the heavy
 * submitters are new threads of their own, each claiming a queue in turn. */
static int submit_lights(void *arg) {
  tko_pool *p = arg;
  int rc = 0;
  for (int i = 0; i < LIGHTS && rc == 0; i++) rc = tko_submit(p, light, NULL, 0);
  tt_count_add(&lights_in, 1);
  cr_assert(tt_gate_wait(&lights_leave));
  return rc;
}

/* A thread that only claims a queue (its submit's task counts in ran). */
static tt_count claimed;

static int claim_queue(void *arg) {
  int rc = tko_submit(arg, count_run, NULL, 0);
  tt_count_add(&claimed, 1);
  cr_assert(tt_gate_wait(&lights_leave));
  return rc;
}

/* A scene: the pool, the worker its blocker holds, and the submitting
 * threads that scene_end joins (each must return 0). */
typedef struct scene {
  tko_pool *pool;
  int blocked; /* the worker the blocker holds */
  tf_thread threads[6];
  int nthreads;
} scene;

static tt_gate heavy_gate = TT_GATE_INIT;
static tt_gate lights_gate = TT_GATE_INIT;
static tt_gate long_gate = TT_GATE_INIT;
static tt_count claims_ran;
static tt_count long_in;
static tt_count *const scene_counts[] = {&light_starts, &lights_in, &blocker_in,
                                         &claimed, &claims_ran, &long_in};
#define SCENE_COUNTS (sizeof scene_counts / sizeof scene_counts[0])

/* The standalone runner (TSan) runs every test in one process: the counts
 * and gates start afresh in each. */
static void scene_start(scene *sc, unsigned recheck_us) {
  for (size_t i = 0; i < SCENE_COUNTS; i++) tt_count_init(scene_counts[i]);
  tt_gate *gates[] = {&blocker_gate, &lights_leave, &heavy_gate, &lights_gate, &long_gate};
  for (size_t i = 0; i < sizeof gates / sizeof gates[0]; i++) {
    pthread_mutex_lock(&gates[i]->mu);
    gates[i]->open = false;
    pthread_mutex_unlock(&gates[i]->mu);
  }
  atomic_store(&blocker_worker, -1);
  tko_options o = tko_basic_options(2);
  o.queues = 2;
  o.recheck_us = recheck_us;
  o.hooks.before_run = note_blocker_worker;
  *sc = (scene){0};
  cr_assert_eq(tko_pool_create(&sc->pool, &o), 0);
  cr_assert_eq(tko_submit(sc->pool, blocker, NULL, 5), 0); /* this thread: queue 0 */
  cr_assert(tt_count_wait_eq(&blocker_in, 1));
  sc->blocked = atomic_load(&blocker_worker);
  cr_assert(sc->blocked == 0 || sc->blocked == 1);
}

static void scene_thread(scene *sc, int (*fn)(void *), void *arg) {
  cr_assert_lt(sc->nthreads, (int)(sizeof sc->threads / sizeof sc->threads[0]));
  cr_assert_eq(tf_thread_start(&sc->threads[sc->nthreads++], fn, arg), 0);
}

/* Submits a heavy task from a new thread, which stays until the scene
 * ends: a thread that ended would leave its queue to the next new one. */
static int submit_heavy_and_stay(void *arg) {
  heavy_probe *h = arg;
  int rc = h->submit(h);
  cr_assert(tt_gate_wait(&lights_leave));
  return rc;
}

static void scene_heavy(scene *sc, heavy_probe *h, int (*submit)(void *)) {
  *h = (heavy_probe){.pool = sc->pool, .submit = submit};
  tt_count_init(&h->started);
  scene_thread(sc, submit_heavy_and_stay, h);
}

/* Lets every thread and the blocker go; returns the light tasks that had
 * not started by then. */
static long scene_end(scene *sc, long lights) {
  long light_left = lights - tt_count_get(&light_starts);
  tt_gate_open(&lights_leave);
  for (int i = 0; i < sc->nthreads; i++) {
    int rc;
    cr_assert(tf_thread_join(&sc->threads[i], &rc));
    cr_assert_eq(rc, 0);
  }
  tt_gate_open(&blocker_gate);
  cr_assert_eq(tko_pool_wait_idle(sc->pool, 60000), 0);
  cr_assert_eq(tko_pool_destroy(sc->pool), 0);
  for (size_t i = 0; i < SCENE_COUNTS; i++) tt_count_fini(scene_counts[i]);
  return light_left;
}

static void wait_heavy(heavy_probe *h) {
  cr_assert(tt_count_wait_eq(&h->started, 1), "a heavy task never started");
}

/* The scene's precondition: more than BOUND light tasks had not started
 * when the heavy task had, so a heavy task that waited for the backlog
 * would show. A machine that holds the submitting threads up long enough
 * lets the backlog run out first; the scene then proves nothing and
 * returns false, for tt_rerun to run it again. */
static bool in_time(heavy_probe *h, long light_left) {
  tt_count_fini(&h->started);
  if (light_left <= BOUND) return false;
  long late = h->at_start - h->at_submit;
  cr_assert_leq(late, BOUND, "a heavy task started after %ld light tasks that began after its submit",
                late);
  return true;
}

#define PROVED_NOTHING "the light backlog ran out first in every attempt: the test proved nothing"

/* Lights on both queues (two threads), then a heavy task on each: one of
 * them lands on the busy worker's queue, where only the other worker can
 * start it. */
static bool busy_workers_queue(void *arg) {
  (void)arg;
  scene sc;
  scene_start(&sc, 0);
  for (int i = 0; i < 2; i++) scene_thread(&sc, submit_lights, sc.pool);
  cr_assert(tt_count_wait_eq(&lights_in, 2));
  heavy_probe h[2];
  for (int i = 0; i < 2; i++) scene_heavy(&sc, &h[i], submit_heavy);
  for (int i = 0; i < 2; i++) wait_heavy(&h[i]);
  long light_left = scene_end(&sc, 2L * LIGHTS);
  bool met = true;
  for (int i = 0; i < 2; i++) met = in_time(&h[i], light_left) && met;
  return met;
}

Test(queues, a_heavy_task_on_a_busy_workers_queue_starts_within_the_recheck_period) {
  cr_assert(tt_rerun(busy_workers_queue, NULL), PROVED_NOTHING);
}

/* The free worker's own queue gets the heavy task while every light task
 * is on the other queue, which it steals from: its takes go to the other
 * queue, so only its looks at the other queues' submissions (once the
 * recheck period has passed) find the heavy task at home. Threads that
 * only claim a queue put the lights and the heavy task where the case
 * needs them. */
static bool stealing_workers_own_queue(void *arg) {
  (void)arg;
  scene sc;
  scene_start(&sc, 0);
  int free_worker = 1 - sc.blocked, k = 1, claims = 0;
  /* Threads in claim order k = 1, 2, ...: queue k % 2. The lights go to
   * the queue that is not the free worker's, the heavy task to its own. */
  if (k % 2 == free_worker) {
    scene_thread(&sc, claim_queue, sc.pool);
    cr_assert(tt_count_wait_eq(&claimed, ++claims));
    k++;
  }
  scene_thread(&sc, submit_lights, sc.pool);
  cr_assert(tt_count_wait_eq(&lights_in, 1));
  k++;
  /* Long enough for the free worker's takes to shrink to one 20 us task
   * each (about 20 us of work a take): no batch is left to recheck, so
   * only a take's look at the other queues can find the heavy task. */
  cr_assert(tt_count_wait_geq(&light_starts, 100));
  if (k % 2 != free_worker) {
    scene_thread(&sc, claim_queue, sc.pool);
    cr_assert(tt_count_wait_eq(&claimed, ++claims));
    k++;
  }
  heavy_probe h;
  scene_heavy(&sc, &h, submit_heavy);
  wait_heavy(&h);
  return in_time(&h, scene_end(&sc, LIGHTS));
}

Test(queues, a_heavy_task_on_a_stealing_workers_own_queue_starts_within_the_recheck_period) {
  cr_assert(tt_rerun(stealing_workers_own_queue, NULL), PROVED_NOTHING);
}

/* A worker helping inside a group wait takes one task at a time, and its
 * clock reading stays where the wait began: its takes must still look at
 * the other queues once the recheck period has passed (the attack on the
 * priority contract: a heavy task waited for the whole group). The free
 * worker runs a task that submits the lights as a group (from the worker's
 * thread: the next queue in claim order, 1) and waits for them, helping;
 * the heavy task goes to queue 0. */
static tko_group help_group;

static int submit_lights_and_help(void *arg) {
  tko_pool *p = arg;
  int rc = 0;
  for (int i = 0; i < LIGHTS && rc == 0; i++) rc = tko_group_submit(p, &help_group, light, NULL, 0);
  tt_count_add(&lights_in, 1);
  return rc ? rc : tko_group_wait(&help_group, -1);
}

static bool helping_group_wait(void *arg) {
  (void)arg;
  scene sc;
  scene_start(&sc, 0);
  cr_assert_eq(tko_group_init(&help_group), 0);
  cr_assert_eq(tko_submit(sc.pool, submit_lights_and_help, sc.pool, 0), 0);
  cr_assert(tt_count_wait_eq(&lights_in, 1));
  cr_assert(tt_count_wait_geq(&light_starts, 100)); /* helping, one light a take */
  heavy_probe h;
  scene_heavy(&sc, &h, submit_heavy);
  wait_heavy(&h);
  bool met = in_time(&h, scene_end(&sc, LIGHTS));
  cr_assert_eq(tko_group_status(&help_group), 0);
  cr_assert_eq(tko_group_destroy(&help_group), 0);
  return met;
}

Test(queues, a_helping_group_wait_looks_at_every_queue) {
  cr_assert(tt_rerun(helping_group_wait, NULL), PROVED_NOTHING);
}

/* An async task goes to queue 0. With the blocker holding one worker and
 * the lights all on queue 1, the free worker takes from queue 1 while its
 * heaviest task beats queue 0's empty plain queue; a heavy async task on
 * queue 0 must count as queue 0's heaviest, or it waits for every light
 * (the review of the queues). */
static int async_heavy(tko_async *op, void *arg) {
  heavy_probe *h = arg;
  h->at_start = tt_count_get(&light_starts);
  tt_count_add(&h->started, 1);
  (void)op;
  return 1; /* completes at once (status 1: a failure, which is fine here) */
}

static int submit_async_heavy(void *arg) {
  heavy_probe *h = arg;
  int rc = tko_submit_async(h->pool, async_heavy, h, 9);
  h->at_submit = tt_count_get(&light_starts);
  return rc;
}

static bool async_heavy_on_queue_0(void *arg) {
  (void)arg;
  scene sc;
  scene_start(&sc, 0);
  scene_thread(&sc, submit_lights, sc.pool); /* the next thread to submit: queue 1 */
  cr_assert(tt_count_wait_eq(&lights_in, 1));
  cr_assert(tt_count_wait_geq(&light_starts, 100)); /* takes of one light each */
  heavy_probe h;
  scene_heavy(&sc, &h, submit_async_heavy);
  wait_heavy(&h);
  return in_time(&h, scene_end(&sc, LIGHTS));
}

Test(queues, a_heavy_async_task_on_queue_0_starts_within_the_recheck_period) {
  cr_assert(tt_rerun(async_heavy_on_queue_0, NULL), PROVED_NOTHING);
}

/* A take after a long task looks at every queue's submissions (its clock
 * reading is the batch's end, not its take). The free worker runs the
 * claim tasks, then a long task; meanwhile the heavy task goes to the busy
 * worker's queue and, once its submit has returned, lights to the free
 * worker's own. Its next take must start the heavy task before any light:
 * the long task lasts more than the recheck period, so that take is due
 * to look; a take that reused its last take's time would find itself
 * within the period and start the lights (a recheck period of 1 ms, longer
 * than their 50 x 20 us). */
enum { LONG_RECHECK_US = 1000, WAKE_LIGHTS = 50 };

static int note_claim(void *arg) {
  (void)arg;
  tt_count_add(&claims_ran, 1);
  return 0;
}

static int long_task(void *arg) {
  (void)arg;
  uint64_t until = tt_now_ns() + 2u * LONG_RECHECK_US * 1000u;
  tt_count_add(&long_in, 1);
  cr_assert(tt_gate_wait(&long_gate));
  while (tt_now_ns() < until) {
  }
  return 0;
}

typedef struct claimer {
  tko_pool *pool;
  heavy_probe *h; /* NULL: the lights' thread */
  int rc;
} claimer;

static int claim_then_submit(void *arg) {
  claimer *c = arg;
  c->rc = tko_submit(c->pool, note_claim, NULL, 0);
  cr_assert(tt_gate_wait(c->h ? &heavy_gate : &lights_gate));
  if (c->rc) return c->rc;
  if (c->h) return c->rc = submit_heavy(c->h);
  for (int i = 0; i < WAKE_LIGHTS && c->rc == 0; i++) c->rc = tko_submit(c->pool, light, NULL, 0);
  return c->rc;
}

Test(queues, a_take_after_a_long_task_looks_at_every_queue) {
  scene sc;
  scene_start(&sc, LONG_RECHECK_US);
  /* Threads 1 and 2 claim queues 1 and 0: the heavy one the busy worker's. */
  heavy_probe h = {.pool = sc.pool};
  tt_count_init(&h.started);
  claimer c[2] = {{sc.pool, sc.blocked == 1 ? &h : NULL, 0},
                  {sc.pool, sc.blocked == 0 ? &h : NULL, 0}};
  for (int i = 0; i < 2; i++) {
    scene_thread(&sc, claim_then_submit, &c[i]);
    cr_assert(tt_count_wait_eq(&claims_ran, i + 1));
  }
  cr_assert_eq(tko_submit(sc.pool, long_task, NULL, 0), 0);
  cr_assert(tt_count_wait_eq(&long_in, 1));
  int heavy_thread = c[0].h ? 0 : 1, rc;
  tt_gate_open(&heavy_gate);
  cr_assert(tf_thread_join(&sc.threads[heavy_thread], &rc));
  cr_assert_eq(rc, 0);
  tt_gate_open(&lights_gate);
  cr_assert(tf_thread_join(&sc.threads[1 - heavy_thread], &rc));
  cr_assert_eq(rc, 0);
  sc.nthreads = 0; /* both joined: the lights are in before the long task ends */
  tt_gate_open(&long_gate);
  wait_heavy(&h);
  (void)scene_end(&sc, WAKE_LIGHTS);
  long late = h.at_start - h.at_submit;
  cr_assert_eq(late, 0, "%ld light tasks submitted after the heavy one started first", late);
  tt_count_fini(&h.started);
}
