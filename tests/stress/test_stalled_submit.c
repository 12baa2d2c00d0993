/* SPDX-License-Identifier: MIT */
/* A submitter stopped between its inbox reservation and its publish
 * (preempted, or in a debugger) holds back only its own task (issue 15).
 * The library's seam tko__test_publish_window (src/structures/inbox.h) parks one
 * chosen submit there until the test releases it; meanwhile other threads
 * submit more tasks than the inbox holds, so the ring fills behind the
 * hole and the submits that find it full put their tasks straight into
 * the queue. Every one of those must run while the submitter is parked;
 * the workers must then go to sleep (not spin at the hole); the parked
 * task, once published, must wake one and run exactly once; the ids stay
 * unique, a batch's consecutive; one thread's tasks stay FIFO.
 *
 * The waits are bounded by the suites' generous limits: on the old inbox,
 * whose drain waited at the hole under the queue lock, no task ran and the
 * 1,024th submit blocked, and these tests report that as a failure rather
 * than hang (the parked submitter is released before anything is
 * asserted, so everything finishes either way).
 *
 * The last two tests park a submitter inside its wake-up instead (seam
 * tko__test_wake_window, src/structures/tko_signal.h). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"
#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

enum { CAP = TKO__INBOX_CAPACITY, WORKERS = 2, SUBMITTERS = 2, PER = 3 * CAP / 2,
       N = SUBMITTERS * PER };

typedef struct token {
  atomic_int runs;
  atomic_int rank; /* when it ran, among the others' tasks */
  atomic_uint_fast64_t id;
} token;

typedef struct stall {
  tko_pool *pool;
  token *tokens;   /* N for the others, then the parked submit's */
  tt_count ran;    /* tasks of the other submitters that ran */
  tt_count parked; /* 1 once the chosen submit is parked */
  tt_count done;   /* the other submitters that returned */
  tt_gate release;
  atomic_uint_fast64_t parked_pos;
  atomic_int next_rank;
} stall;

static stall *cur; /* the test's, for the seam */
static _Thread_local bool park_me;

/* The seam: parks the thread that asked for it, once, before its publish. */
static void park(uint64_t pos, bool published) {
  if (!park_me || published) return;
  park_me = false;
  atomic_store(&cur->parked_pos, pos);
  tt_count_add(&cur->parked, 1);
  tt_gate_wait(&cur->release);
}

static int other_fn(void *arg) {
  atomic_store(&((token *)arg)->rank, atomic_fetch_add(&cur->next_rank, 1));
  atomic_fetch_add(&((token *)arg)->runs, 1);
  tt_count_add(&cur->ran, 1);
  return 0;
}

static int parked_fn(void *arg) {
  atomic_fetch_add(&((token *)arg)->runs, 1);
  return 0;
}

static void record_id(void *user, const tko_task_info *t) {
  (void)user;
  if (t->fn == other_fn || t->fn == parked_fn) atomic_store(&((token *)t->arg)->id, t->id);
}

/* rings: submits go through each thread's own ring (ring.h); else, as a
 * one-worker pool's do, through the shared inbox (inbox.h). */
static stall *stall_new(unsigned workers, bool rings) {
  stall *s = calloc(1, sizeof *s);
  s->tokens = calloc(N + 8, sizeof *s->tokens);
  tt_count_init(&s->ran);
  tt_count_init(&s->parked);
  tt_count_init(&s->done);
  pthread_mutex_init(&s->release.mu, NULL);
  pthread_cond_init(&s->release.cv, NULL);
  tko_options o = tko_basic_options(workers);
  o.hooks.before_run = record_id;
  cr_assert_eq(tko_pool_create(&s->pool, &o), 0);
  s->pool->rings.off = !rings; /* before any submit */
  cur = s;
  atomic_store(&tko__test_publish_window, park);
  return s;
}

static void stall_free(stall *s) {
  atomic_store(&tko__test_publish_window, NULL);
  cur = NULL;
  tt_count_fini(&s->ran);
  tt_count_fini(&s->parked);
  tt_count_fini(&s->done);
  pthread_mutex_destroy(&s->release.mu);
  pthread_cond_destroy(&s->release.cv);
  free(s->tokens);
  free(s);
}

/* The thread that is parked: one task, or a batch of three. */
typedef struct parked_arg {
  stall *s;
  size_t n;
  int rc;
} parked_arg;

static void *parked_main(void *arg) {
  parked_arg *a = arg;
  token *t = &a->s->tokens[N];
  park_me = true;
  if (a->n == 1) {
    a->rc = tko_submit(a->s->pool, parked_fn, t, 0);
  } else {
    tko_task batch[3];
    for (size_t i = 0; i < 3; i++) batch[i] = (tko_task){parked_fn, &t[i], 0};
    a->rc = tko_submit_batch(a->s->pool, batch, 3);
  }
  return NULL;
}

/* The others: singles, batches, or a batch larger than the inbox. */
typedef enum { SINGLES, BATCHES, ONE_BIG_BATCH } how;

typedef struct other_arg {
  stall *s;
  size_t first;
  how how;
  int rc;
  bool one_weight; /* all weight 0, else 0, 1, 2 in turn */
} other_arg;

enum { BATCH = 100 };

static void *other_main(void *arg) {
  other_arg *a = arg;
  token *t = &a->s->tokens[a->first];
  if (a->how == SINGLES) {
    for (size_t i = 0; i < PER && a->rc == 0; i++)
      a->rc = tko_submit(a->s->pool, other_fn, &t[i], a->one_weight ? 0 : (int)(i % 3));
    tt_count_add(&a->s->done, 1);
    return NULL;
  }
  size_t step = a->how == BATCHES ? BATCH : PER;
  tko_task *batch = calloc(step, sizeof *batch);
  for (size_t at = 0; at < PER && a->rc == 0; at += step) {
    size_t n = PER - at < step ? PER - at : step;
    for (size_t i = 0; i < n; i++) batch[i] = (tko_task){other_fn, &t[at + i], (int)(i % 3)};
    a->rc = tko_submit_batch(a->s->pool, batch, n);
  }
  free(batch);
  tt_count_add(&a->s->done, 1);
  return NULL;
}

/* Bounded wait on a white-box condition no public wait covers (yields). */
static bool within(bool (*cond)(tko_pool *), tko_pool *pool, long ms) {
  uint64_t end = tt_now_ns() + (uint64_t)ms * 1000000u;
  while (!cond(pool))
    if (tt_now_ns() > end) return false;
    else sched_yield();
  return true;
}

static bool all_asleep(tko_pool *pool) {
  return tko__idle_sleeping(tko__load_seq(&pool->idle.state)) == WORKERS;
}

static bool closed(tko_pool *pool) { return tko__load_seq(&pool->closing); }

/* CPU time the pool's basic workers have used, in ns. */
static uint64_t workers_cpu_ns(tko_pool *pool) {
  uint64_t ns = 0;
  for (unsigned i = 0; i < WORKERS; i++) {
    clockid_t cid;
    struct timespec ts;
    if (pthread_getcpuclockid(pool->slots[i].thread, &cid) || clock_gettime(cid, &ts)) return 0;
    ns += (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  }
  return ns;
}

/* The workers stay asleep beside the hole: over a timed wait of the API's
 * (the parked task keeps the pool from going idle) they use a small part
 * of the CPU two spinning workers would. A snapshot of the sleeper count
 * alone passed with workers that spun through sleep and cancel (mutant
 * inbox-worker-spins-at-a-hole survived a CI run). */
static bool stay_asleep(tko_pool *pool) {
  enum { WAIT_MS = 200 };
  uint64_t before = workers_cpu_ns(pool);
  if (tko_pool_wait_idle(pool, WAIT_MS) != -ETIMEDOUT) return false;
  uint64_t used = workers_cpu_ns(pool) - before;
  return used < (uint64_t)WAIT_MS * 1000000u / 4; /* spinning: about 2 x WAIT_MS */
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Parks one submit of n tasks, lets the others submit N tasks as told (one
 * after the other if in_turn), and checks everything but what the caller
 * checks after the release. Returns with the parked submit released and
 * every thread joined. */
static void run_around_a_parked_submit(stall *s, size_t parked_n, const how hows[SUBMITTERS],
                                       bool in_turn) {
  bool rings = !s->pool->rings.off;
  pthread_t pt, th[SUBMITTERS];
  parked_arg pa = {s, parked_n, 1};
  cr_assert_eq(pthread_create(&pt, NULL, parked_main, &pa), 0);
  cr_assert(tt_count_wait_geq(&s->parked, 1), "the submit never reached the seam");
  uint64_t hole = atomic_load(&s->parked_pos);
  other_arg oa[SUBMITTERS];
  for (int i = 0; i < SUBMITTERS; i++) {
    oa[i] = (other_arg){s, (size_t)i * PER, hows[i], 0, false};
    cr_assert_eq(pthread_create(&th[i], NULL, other_main, &oa[i]), 0);
    if (in_turn) (void)tt_count_wait_geq_within(&s->done, i + 1, TT_SCALE(20000, 60000));
  }
  /* Every other task runs while the submitter stays parked. */
  bool all_ran = tt_count_wait_geq_within(&s->ran, N, TT_SCALE(20000, 60000));
  /* Positions went past the ring: submits found it full behind the hole. */
  bool went_round = rings || tko__inbox_reserved(&s->pool->inbox) >= hole + parked_n + CAP;
  /* With only the hole left, the workers sleep rather than spin. */
  bool slept = all_ran && within(all_asleep, s->pool, TT_SCALE(20000, 60000)) &&
               (rings || stay_asleep(s->pool));
  /* In a ring the parked task is not accepted until its publish: the pool
   * is idle meanwhile (through the inbox its reservation counts). */
  bool idle_early = rings && tko_pool_wait_idle(s->pool, TT_SCALE(20000, 60000)) == 0;
  bool ran_early = atomic_load(&s->tokens[N].runs) != 0;
  tt_gate_open(&s->release);
  pthread_join(pt, NULL);
  for (int i = 0; i < SUBMITTERS; i++) pthread_join(th[i], NULL);
  cr_assert(all_ran, "other submitters' tasks waited for the parked one");
  cr_assert(went_round, "the inbox never filled behind the hole");
  cr_assert(slept, "a worker kept spinning at the hole");
  cr_assert_not(ran_early, "the parked task ran before its publish");
  cr_assert_eq(idle_early, rings, "a parked ring submit counted before its publish");
  cr_assert_eq(pa.rc, 0);
  for (int i = 0; i < SUBMITTERS; i++) cr_assert_eq(oa[i].rc, 0);
  /* Its publish wakes a sleeping worker: the pool goes idle. */
  cr_assert_eq(tko_pool_wait_idle(s->pool, TT_SCALE(20000, 60000)), 0, "the parked task never ran");
  size_t total = N + parked_n;
  for (size_t i = 0; i < total; i++) cr_assert_eq(atomic_load(&s->tokens[i].runs), 1, "task %zu", i);
  tko_stats st;
  tko_pool_stats(s->pool, &st);
  cr_assert_eq(st.submitted, total);
  cr_assert_eq(st.completed, total);
  cr_assert_eq(st.queued, 0);
  /* Ids: unique; through the inbox, from 1 to the count (positions,
   * claims included). */
  uint64_t *ids = calloc(total, sizeof *ids);
  for (size_t i = 0; i < total; i++) {
    uint64_t id = ids[i] = atomic_load(&s->tokens[i].id);
    cr_assert(id >= 1 && (rings || id <= total), "task %zu has id %llu", i, (unsigned long long)id);
  }
  qsort(ids, total, sizeof *ids, cmp_u64);
  for (size_t i = 1; i < total; i++)
    cr_assert_neq(ids[i], ids[i - 1], "id %llu given twice", (unsigned long long)ids[i]);
  free(ids);
  cr_assert_eq(atomic_load(&s->tokens[N].id), hole + 1);
  /* And the inbox settles: head catches up with every position. */
  cr_assert_eq(tko_pool_shutdown_timed(s->pool, TKO_DRAIN, TT_SCALE(20000, 60000)), 0);
  cr_assert(tko__inbox_settled(&s->pool->inbox));
  cr_assert_eq(tko_pool_destroy(s->pool), 0);
}

/* Kills inbox-drain-waits-at-a-hole, inbox-head-passes-a-hole,
 * inbox-moved-not-marked, inbox-worker-spins-at-a-hole
 * (scripts/mutants.list). */
Test(stalled_submit, single_submits_run_around_a_parked_one) {
  stall *s = stall_new(WORKERS, false);
  const how hows[SUBMITTERS] = {SINGLES, SINGLES};
  run_around_a_parked_submit(s, 1, hows, false);
  stall_free(s);
}

/* The batch larger than the inbox comes first: its claim starts inside
 * head's window (those positions are marked done at once) and runs past it.
 * Kills inbox-claim-window-not-marked, inbox-claim-ids-collide. */
Test(stalled_submit, batches_run_around_a_parked_batch) {
  stall *s = stall_new(WORKERS, false);
  const how hows[SUBMITTERS] = {ONE_BIG_BATCH, BATCHES};
  run_around_a_parked_submit(s, 3, hows, true);
  /* The parked batch's ids are consecutive, as any batch's. */
  for (size_t i = 1; i < 3; i++)
    cr_assert_eq(atomic_load(&s->tokens[N + i].id), atomic_load(&s->tokens[N].id) + i);
  for (size_t i = 1; i < PER; i++) /* the big batch: one claim */
    cr_assert_eq(atomic_load(&s->tokens[i].id), atomic_load(&s->tokens[0].id) + i);
  for (size_t i = 1; i < PER; i++) /* and each batch of BATCH */
    if (i % BATCH)
      cr_assert_eq(atomic_load(&s->tokens[PER + i].id), atomic_load(&s->tokens[PER + i - 1].id) + 1);
  stall_free(s);
}

/* The same through submit rings (ring.h; issue 15): a submitter parked
 * after writing its slots and before the CAS that publishes them holds
 * back no other thread's task - here each other submitter fills its own
 * ring and moves it along - the workers sleep meanwhile, and its publish
 * wakes one. */
Test(stalled_submit, ring_single_submits_run_around_a_parked_one) {
  stall *s = stall_new(WORKERS, true);
  const how hows[SUBMITTERS] = {SINGLES, SINGLES};
  run_around_a_parked_submit(s, 1, hows, false);
  stall_free(s);
}

/* A batch larger than a ring goes a ringful at a time under the queue
 * lock; batches of 100 and the parked batch of 3 go lock-free. */
Test(stalled_submit, ring_batches_run_around_a_parked_batch) {
  stall *s = stall_new(WORKERS, true);
  const how hows[SUBMITTERS] = {ONE_BIG_BATCH, BATCHES};
  run_around_a_parked_submit(s, 3, hows, true);
  for (size_t i = 1; i < 3; i++)
    cr_assert_eq(atomic_load(&s->tokens[N + i].id), atomic_load(&s->tokens[N].id) + i);
  for (size_t i = 1; i < PER; i++) /* the big batch's ids are consecutive too */
    cr_assert_eq(atomic_load(&s->tokens[i].id), atomic_load(&s->tokens[0].id) + i);
  stall_free(s);
}

typedef struct shutdown_arg {
  tko_pool *pool;
  int rc;
} shutdown_arg;

static void *shutdown_main(void *arg) {
  shutdown_arg *a = arg;
  a->rc = tko_pool_shutdown_timed(a->pool, TKO_DRAIN, TT_SCALE(20000, 60000));
  return NULL;
}

/* A reservation made before the close is published after it: shutdown
 * waits for it, runs it, and every worker still exits.
 * Kills inbox-shutdown-ignores-a-hole, inbox-closed-worker-wakes-nobody. */
Test(stalled_submit, shutdown_waits_for_a_parked_submit) {
  stall *s = stall_new(WORKERS, false);
  pthread_t pt, sh;
  parked_arg pa = {s, 1, 1};
  cr_assert_eq(pthread_create(&pt, NULL, parked_main, &pa), 0);
  cr_assert(tt_count_wait_geq(&s->parked, 1));
  shutdown_arg sa = {s->pool, 1};
  cr_assert_eq(pthread_create(&sh, NULL, shutdown_main, &sa), 0);
  /* Closed, and both workers back asleep beside the hole. */
  bool is_closed = within(closed, s->pool, TT_SCALE(20000, 60000));
  bool slept = is_closed && within(all_asleep, s->pool, TT_SCALE(20000, 60000));
  /* The close woke them; they must stay, not leave with the reservation
   * still unpublished. A sleeper count seen right after the close can
   * predate its wake-up (mutant inbox-shutdown-ignores-a-hole survived a
   * CI run so), so look again after a window: a timed wait of the API's,
   * which the pending reservation keeps from returning early. */
  (void)tko_pool_wait_idle(s->pool, 200);
  bool stayed = tko__load_seq(&s->pool->basic_alive) == WORKERS;
  tt_gate_open(&s->release);
  pthread_join(pt, NULL);
  pthread_join(sh, NULL);
  cr_assert(slept, "the workers did not sleep beside the reservation");
  cr_assert(stayed, "the workers left while a reservation was unpublished");
  cr_assert_eq(pa.rc, 0, "a reservation made before the close is accepted");
  cr_assert_eq(sa.rc, 0, "shutdown did not finish once it was published");
  cr_assert_eq(atomic_load(&s->tokens[N].runs), 1);
  tko_stats st;
  tko_pool_stats(s->pool, &st);
  cr_assert_eq(st.submitted, 1);
  cr_assert_eq(st.completed, 1);
  cr_assert_eq(st.caller_runs, 0, "a worker ran it, not the shutting-down thread");
  cr_assert_eq(tko_pool_destroy(s->pool), 0);
  stall_free(s);
}

/* Through a ring nothing is visible before the publish, so a shutdown
 * does not wait for a parked submit: it closes the rings, finishes, and
 * the parked submit, released, fails with -ESHUTDOWN; its task never
 * runs and was never counted. */
Test(stalled_submit, ring_shutdown_refuses_a_parked_submit) {
  stall *s = stall_new(WORKERS, true);
  pthread_t pt;
  parked_arg pa = {s, 1, 1};
  cr_assert_eq(pthread_create(&pt, NULL, parked_main, &pa), 0);
  cr_assert(tt_count_wait_geq(&s->parked, 1));
  int rc = tko_pool_shutdown_timed(s->pool, TKO_DRAIN, TT_SCALE(20000, 60000));
  tt_gate_open(&s->release);
  pthread_join(pt, NULL);
  cr_assert_eq(rc, 0, "shutdown waited for an unpublished ring slot");
  cr_assert_eq(pa.rc, -ESHUTDOWN);
  cr_assert_eq(atomic_load(&s->tokens[N].runs), 0);
  tko_stats st;
  tko_pool_stats(s->pool, &st);
  cr_assert_eq(st.submitted, 0);
  cr_assert_eq(tko_pool_destroy(s->pool), 0);
  stall_free(s);
}

/* One thread's tasks stay FIFO (equal weights) around a parked submit: the
 * worker is pinned, so the first 1,023 wait published in the ring behind
 * the hole, and the 1,024th finds the ring full. It must drain those into
 * the queue before it puts its own task there directly, and so must every
 * later one. Kills inbox-claim-without-drain. */
Test(stalled_submit, one_threads_tasks_stay_fifo_around_a_parked_submit) {
  stall *s = stall_new(1, false);
  tt_pin pin = TT_PIN_INIT;
  cr_assert_eq(tko_submit(s->pool, tt_pin_fn, &pin, 0), 0);
  cr_assert(tt_count_wait_geq(&pin.started, 1));
  pthread_t pt, th;
  parked_arg pa = {s, 1, 1};
  cr_assert_eq(pthread_create(&pt, NULL, parked_main, &pa), 0);
  cr_assert(tt_count_wait_geq(&s->parked, 1));
  other_arg oa = {s, 0, SINGLES, 0, true};
  cr_assert_eq(pthread_create(&th, NULL, other_main, &oa), 0);
  bool submitted = tt_count_wait_geq_within(&s->done, 1, TT_SCALE(20000, 60000));
  tt_gate_open(&pin.gate);
  bool all_ran = tt_count_wait_geq_within(&s->ran, PER, TT_SCALE(20000, 60000));
  tt_gate_open(&s->release);
  pthread_join(pt, NULL);
  pthread_join(th, NULL);
  cr_assert(submitted, "a submit waited for the parked one");
  cr_assert(all_ran);
  cr_assert_eq(oa.rc, 0);
  cr_assert_eq(pa.rc, 0);
  for (size_t i = 0; i < PER; i++)
    cr_assert_eq(atomic_load(&s->tokens[i].rank), (int)i, "task %zu ran out of submit order", i);
  cr_assert_eq(tko_pool_wait_idle(s->pool, TT_SCALE(20000, 60000)), 0);
  cr_assert_eq(atomic_load(&s->tokens[N].runs), 1);
  cr_assert_eq(tko_pool_destroy(s->pool), 0);
  pthread_mutex_destroy(&pin.gate.mu);
  pthread_cond_destroy(&pin.gate.cv);
  tt_count_fini(&pin.started);
  stall_free(s);
}

/* A worker asleep beside a hole looks again by itself. The hole's publish
 * is a release store, so its submitter may read idle.state before the
 * publish is seen and skip its wake-up (src/structures/signal.c). Here the seam parks
 * a submit before its publish, until the pool's only worker sleeps beside
 * the hole, then again after its publish, before its wake-up: the task
 * must run meanwhile. The worker waits either in its own sleep (a plain
 * submit) or in a group wait of a task it runs (a group member's submit),
 * begun after the reservation.
 * Kill hole-sleep-without-a-poll and hole-help-without-a-poll. */
typedef struct two_step {
  tt_count at_hole, published, ran;
  tt_gate publish, wake;
  tko_group group, *g; /* g: &group, for a group member's submit */
  tko_pool *pool;
} two_step;

static two_step *step;

static void park_twice(uint64_t pos, bool published) {
  (void)pos;
  if (!park_me) return;
  if (!published) {
    tt_count_add(&step->at_hole, 1);
    tt_gate_wait(&step->publish);
  } else {
    park_me = false;
    tt_count_add(&step->published, 1);
    tt_gate_wait(&step->wake);
  }
}

static int count_run(void *arg) {
  tt_count_add(arg, 1);
  return 0;
}

static void *submit_through_the_seam(void *arg) {
  two_step *t = arg;
  park_me = true;
  if (t->g) cr_assert_eq(tko_group_submit(t->pool, t->g, count_run, &t->ran, 0), 0);
  else cr_assert_eq(tko_submit(t->pool, count_run, &t->ran, 0), 0);
  return NULL;
}

/* The task that waits for its group, on the only worker. */
static int wait_for_group(void *arg) {
  two_step *t = arg;
  return tko_group_wait(t->g, -1);
}

static bool one_asleep(tko_pool *pool) {
  return tko__idle_sleeping(tko__load_seq(&pool->idle.state)) == 1;
}

/* Whether the helping worker waits on the help condition (white-box). */
static bool one_helper(tko_pool *pool) { return tko__load_seq(&pool->helpers) == 1; }

static void publish_that_wakes_nobody(bool in_group_wait) {
  two_step t = {0};
  step = &t;
  tt_count_init(&t.at_hole);
  tt_count_init(&t.published);
  tt_count_init(&t.ran);
  t.publish = (tt_gate)TT_GATE_INIT;
  t.wake = (tt_gate)TT_GATE_INIT;
  tko_options o = tko_basic_options(1);
  cr_assert_eq(tko_pool_create(&t.pool, &o), 0);
  if (in_group_wait) {
    cr_assert_eq(tko_group_init(&t.group), 0);
    t.g = &t.group;
  }
  atomic_store(&tko__test_publish_window, park_twice);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, submit_through_the_seam, &t), 0);
  cr_assert(tt_count_wait_geq(&t.at_hole, 1));
  /* A task behind the hole wakes the worker, which then finds only the
   * hole (a sleep begun before the reservation is the submitter's to wake:
   * its reservation CAS pairs with that sleep). */
  if (in_group_wait) {
    cr_assert_eq(tko_submit(t.pool, wait_for_group, &t, 0), 0);
  } else {
    tt_count other = TT_COUNT_INIT;
    cr_assert_eq(tko_submit(t.pool, count_run, &other, 0), 0);
    cr_assert(tt_count_wait_geq(&other, 1));
  }
  bool waiting = within(in_group_wait ? one_helper : one_asleep, t.pool, TT_SCALE(20000, 60000));
  tt_gate_open(&t.publish);
  bool published = tt_count_wait_geq_within(&t.published, 1, TT_SCALE(20000, 60000));
  bool ran = tt_count_wait_geq_within(&t.ran, 1, TT_SCALE(10000, 30000));
  tt_gate_open(&t.wake);
  pthread_join(th, NULL);
  atomic_store(&tko__test_publish_window, NULL);
  cr_assert(waiting, "the worker never waited beside the hole");
  cr_assert(published);
  cr_assert(ran, "the hole's task waited for its submitter's wake-up");
  cr_assert_eq(tko_pool_wait_idle(t.pool, TT_SCALE(20000, 60000)), 0);
  if (in_group_wait) cr_assert_eq(tko_group_destroy(t.g), 0);
  cr_assert_eq(tko_pool_destroy(t.pool), 0);
  tt_count_fini(&t.at_hole);
  tt_count_fini(&t.published);
  tt_count_fini(&t.ran);
  step = NULL;
}

Test(stalled_submit, a_sleeping_worker_finds_a_publish_that_wakes_nobody) {
  publish_that_wakes_nobody(false);
}

Test(stalled_submit, a_helping_wait_finds_a_publish_that_wakes_nobody) {
  publish_that_wakes_nobody(true);
}

/* A submitter stopped inside its wake-up (src/structures/signal.c): after
 * it decided to wake a sleeper and before its claim of one, or after its
 * claim and before its unpark. The idle set takes no lock, so the others'
 * submits still wake a worker and every one of their tasks runs, and the
 * workers go back to sleep, while it stays parked. A claimed sleeper is not
 * counted searching until its waker has unparked it (or it runs), so the
 * others do not count on a worker that nobody unparked. Once released,
 * its sleeper wakes and the counts settle: both workers asleep, nobody
 * searching. Kills a-waker-counts-before-its-unpark. */
enum { WAKE_PER = 300 };

typedef struct wake_stall {
  tko_pool *pool;
  enum tko__wake_point at; /* where to park: decided, or claimed */
  tt_count parked, ran, ran_parked;
  tt_gate release;
  atomic_bool returned; /* the parked thread's submit returned */
  int rc;
} wake_stall;

static wake_stall *wake_cur;
static _Thread_local bool park_in_wake;

static void park_in_wake_window(enum tko__wake_point at) {
  if (!park_in_wake || at != wake_cur->at) return;
  park_in_wake = false;
  tt_count_add(&wake_cur->parked, 1);
  tt_gate_wait(&wake_cur->release);
}

static void *parked_waker_main(void *arg) {
  wake_stall *w = arg;
  park_in_wake = true;
  w->rc = tko_submit(w->pool, count_run, &w->ran_parked, 0);
  park_in_wake = false;
  atomic_store(&w->returned, true);
  return NULL;
}

typedef struct waker_other {
  wake_stall *w;
  int rc;
} waker_other;

static void *other_waker_main(void *arg) {
  waker_other *o = arg;
  for (int i = 0; i < WAKE_PER && o->rc == 0; i++)
    o->rc = tko_submit(o->w->pool, count_run, &o->w->ran, 0);
  return NULL;
}

static bool settled(tko_pool *pool) {
  return tko__load_seq(&pool->idle.state) == WORKERS * TKO__SLEEPING_ONE;
}

/* The scene's precondition: the chosen submit reached the seam (a worker
 * that woke by itself meanwhile, from a timed sleep, can leave it nobody
 * to wake). */
static bool parked_waker_scene(void *arg) {
  wake_stall w = {.at = *(enum tko__wake_point *)arg, .release = TT_GATE_INIT};
  tt_count_init(&w.parked);
  tt_count_init(&w.ran);
  tt_count_init(&w.ran_parked);
  tko_options o = tko_basic_options(WORKERS);
  cr_assert_eq(tko_pool_create(&w.pool, &o), 0);
  wake_cur = &w;
  atomic_store(&tko__test_wake_window, park_in_wake_window);
  cr_assert(within(all_asleep, w.pool, TT_SCALE(20000, 60000)), "the workers never slept");
  pthread_t pt, th[SUBMITTERS];
  cr_assert_eq(pthread_create(&pt, NULL, parked_waker_main, &w), 0);
  uint64_t end = tt_now_ns() + (uint64_t)TT_SCALE(20000, 60000) * 1000000u;
  while (tt_count_get(&w.parked) == 0 && !atomic_load(&w.returned) && tt_now_ns() < end)
    sched_yield();
  bool parked = tt_count_get(&w.parked) == 1;
  bool all_ran = false, slept = false;
  waker_other oa[SUBMITTERS];
  if (parked) {
    for (int i = 0; i < SUBMITTERS; i++) {
      oa[i] = (waker_other){&w, 0};
      cr_assert_eq(pthread_create(&th[i], NULL, other_waker_main, &oa[i]), 0);
    }
    all_ran = tt_count_wait_geq_within(&w.ran, SUBMITTERS * WAKE_PER, TT_SCALE(20000, 60000));
    slept = all_ran && within(all_asleep, w.pool, TT_SCALE(20000, 60000));
  }
  tt_gate_open(&w.release);
  pthread_join(pt, NULL);
  if (parked)
    for (int i = 0; i < SUBMITTERS; i++) pthread_join(th[i], NULL);
  atomic_store(&tko__test_wake_window, NULL);
  if (parked) {
    cr_assert(all_ran, "the others' tasks waited for a waker parked %s its claim",
              w.at == TKO__WAKE_CLAIMED ? "after" : "before");
    cr_assert(slept, "a worker going to sleep waited for the parked waker");
    for (int i = 0; i < SUBMITTERS; i++) cr_assert_eq(oa[i].rc, 0);
    cr_assert_eq(w.rc, 0);
    cr_assert_eq(tko_pool_wait_idle(w.pool, TT_SCALE(20000, 60000)), 0);
    cr_assert_eq(tt_count_get(&w.ran), SUBMITTERS * WAKE_PER);
    cr_assert_eq(tt_count_get(&w.ran_parked), 1);
    cr_assert(within(settled, w.pool, TT_SCALE(20000, 60000)), "the idle counts drifted");
  }
  cr_assert_eq(tko_pool_destroy(w.pool), 0);
  wake_cur = NULL;
  tt_count_fini(&w.parked);
  tt_count_fini(&w.ran);
  tt_count_fini(&w.ran_parked);
  return parked;
}

Test(stalled_submit, a_waker_parked_before_its_claim_holds_back_nobody) {
  enum tko__wake_point at = TKO__WAKE_DECIDED;
  cr_assert(tt_rerun(parked_waker_scene, &at), "the submit never reached the wake-up");
}

Test(stalled_submit, a_waker_parked_after_its_claim_holds_back_nobody) {
  enum tko__wake_point at = TKO__WAKE_CLAIMED;
  cr_assert(tt_rerun(parked_waker_scene, &at), "the submit never reached the wake-up");
}

/* ---- a full ring ---------------------------------------------------------
 * A submitter whose ring holds a segment's worth that no drain has moved
 * (the workers are behind) goes on without any lock (ring.h: rings never
 * fill). The seam tko__test_full_ring_window (src/engine/engine.h) parks it
 * right there, with at least RING_CAP of its tasks published on a paused pool; the
 * pool is resumed and other threads submit: their tasks, and the parked
 * thread's published ones, must all run while it stays parked. Then it is
 * released, and every one of its tasks runs once. */
enum { RING_CAP = TKO__RING_CAPACITY, FULL_MINE = 2 * RING_CAP + 5 };

typedef struct full_ring {
  tko_pool *pool;
  tt_count parked, ran_mine, ran_others;
  tt_gate release;
  atomic_long submitted;       /* of mine, accepted */
  atomic_long published_parked; /* of mine, published when it parked */
  atomic_int runs[FULL_MINE];
} full_ring;

static full_ring *fr;
static _Thread_local bool fr_park_me;

static void park_at_full_ring(tko_pool *pool) {
  (void)pool;
  if (!fr_park_me) return;
  fr_park_me = false;
  atomic_store(&fr->published_parked, atomic_load(&fr->submitted));
  tt_count_add(&fr->parked, 1);
  tt_gate_wait(&fr->release);
}

static int mine_fn(void *arg) {
  atomic_fetch_add(&fr->runs[(intptr_t)arg], 1);
  tt_count_add(&fr->ran_mine, 1);
  return 0;
}

static int others_fn(void *arg) {
  (void)arg;
  tt_count_add(&fr->ran_others, 1);
  return 0;
}

static void *submit_mine(void *arg) {
  (void)arg;
  fr_park_me = true;
  for (long i = 0; i < FULL_MINE; i++) {
    if (tko_submit(fr->pool, mine_fn, (void *)(intptr_t)i, 0)) return (void *)1;
    atomic_fetch_add(&fr->submitted, 1);
  }
  return NULL;
}

static void *submit_others(void *arg) {
  (void)arg;
  for (long i = 0; i < 3 * RING_CAP; i++)
    if (tko_submit(fr->pool, others_fn, NULL, (int)(i % 3))) return (void *)1;
  return NULL;
}

Test(stalled_submit, a_submitter_parked_at_its_full_ring_holds_up_no_one) {
  full_ring s;
  memset(&s, 0, sizeof s);
  tt_count_init(&s.parked);
  tt_count_init(&s.ran_mine);
  tt_count_init(&s.ran_others);
  pthread_mutex_init(&s.release.mu, NULL);
  pthread_cond_init(&s.release.cv, NULL);
  fr = &s;
  tko_options o = tko_basic_options(WORKERS);
  cr_assert_eq(tko_pool_create(&s.pool, &o), 0);
  atomic_store(&tko__test_full_ring_window, park_at_full_ring);
  cr_assert_eq(tko_pool_pause(s.pool), 0); /* nothing moves its ring: it fills */
  pthread_t mine, others;
  cr_assert_eq(pthread_create(&mine, NULL, submit_mine, NULL), 0);
  bool parked = tt_count_wait_geq(&s.parked, 1);
  cr_assert_eq(tko_pool_resume(s.pool), 0);
  cr_assert_eq(pthread_create(&others, NULL, submit_others, NULL), 0);
  bool others_ran = tt_count_wait_geq(&s.ran_others, 3 * RING_CAP);
  long published = atomic_load(&s.published_parked);
  bool mine_ran = tt_count_wait_geq(&s.ran_mine, published);
  long mine_while_parked = tt_count_get(&s.ran_mine);
  tt_gate_open(&s.release);
  void *rc_mine, *rc_others;
  pthread_join(mine, &rc_mine);
  pthread_join(others, &rc_others);
  cr_assert_eq(tko_pool_wait_idle(s.pool, TT_LONG_MS), 0);
  atomic_store(&tko__test_full_ring_window, NULL);
  cr_assert(parked, "the submit never found its ring full");
  cr_assert(others_ran, "other threads' tasks did not all run while a submitter was parked");
  cr_assert(mine_ran, "its published tasks did not run while it was parked");
  /* A worker's sweep of the other queue's rings may move part of the
   * ring while the pool is paused (shard.c), so the ring fills later. */
  cr_assert_geq(published, RING_CAP);
  cr_assert_eq(mine_while_parked, published, "more of its tasks ran than it had published");
  cr_assert_null(rc_mine);
  cr_assert_null(rc_others);
  for (long i = 0; i < FULL_MINE; i++) cr_assert_eq(atomic_load(&s.runs[i]), 1, "task %ld", i);
  cr_assert_eq(tt_count_get(&s.ran_others), 3 * RING_CAP);
  cr_assert_eq(tko_pool_destroy(s.pool), 0);
  fr = NULL;
  tt_count_fini(&s.parked);
  tt_count_fini(&s.ran_mine);
  tt_count_fini(&s.ran_others);
  pthread_mutex_destroy(&s.release.mu);
  pthread_cond_destroy(&s.release.cv);
}
