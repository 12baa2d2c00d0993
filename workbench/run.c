/* Runs one scenario: builds the task mix, starts the pool, the producers and
 * the sampler, releases the floods one by one, and collects per-task queue
 * wait and run time through the pool's hooks.
 *
 * Per task, the hooks write one slot of arrays allocated up front (indexed by
 * the task's place in the mix, which its argument points into), so the
 * measuring allocates nothing per task. Each slot is written by the one
 * worker that ran the task and read only after tko_pool_shutdown has joined
 * every worker, which orders the writes before the reads.
 *
 * Floods: the main thread opens a gate for flood b; each producer submits
 * its share of the flood and reports back; the main thread then waits for
 * the pool to go idle, and lets gap_ms of idle time pass before the next
 * flood, so elastic workers have time to retire in between. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wb.h"

uint64_t wb_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void wb_sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

/* CPU work is a register-only loop run for a calibrated number of rounds
 * (so the amount of work per task does not depend on preemption). Set once
 * before any worker starts; thread creation orders it before their reads. */
static double spin_rounds_per_us = 100.0;

static uint64_t spin(uint64_t rounds) {
  uint64_t x = 0x2545f4914f6cdd1dull;
  for (uint64_t i = 0; i < rounds; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    /* Keeps the loop from being folded away without touching memory. */
    __asm__ volatile("" : "+r"(x));
  }
  return x;
}

static void spin_calibrate(void) {
  uint64_t rounds = 1024;
  for (;;) {
    uint64_t t0 = wb_now_ns();
    spin(rounds);
    uint64_t dt = wb_now_ns() - t0;
    if (dt >= 20000000u || rounds >= (UINT64_C(1) << 40)) {
      spin_rounds_per_us = (double)rounds * 1000.0 / (double)(dt ? dt : 1);
      return;
    }
    rounds *= 2;
  }
}

static int task_fn(void *arg) {
  const wb_task *t = arg;
  if (t->work_us) {
    if (t->kind == WB_TASK_IO)
      wb_sleep_ns((uint64_t)t->work_us * 1000u);
    else
      spin((uint64_t)((double)t->work_us * spin_rounds_per_us));
  }
  return t->fail ? 1 : 0;
}

typedef struct run_state {
  wb_result *res;
  tko_pool *pool;
  /* The flood gate. mu protects released, reported and abort; cv signals a
   * change in any of them, in either direction. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned released;  /* floods opened so far */
  unsigned reported;  /* producer shares submitted so far, all floods */
  bool abort;
} run_state;

typedef struct producer {
  pthread_t thread;
  run_state *st;
  unsigned index;
  uint64_t errors;
  int first_error;
} producer;

static size_t task_index(const wb_result *res, const tko_task_info *t) {
  return (size_t)((const wb_task *)t->arg - res->tasks);
}

static void before_run(void *user, const tko_task_info *t) {
  wb_result *res = user;
  res->wait_ns[task_index(res, t)] = t->wait_ns;
}

static void after_run(void *user, const tko_task_info *t) {
  wb_result *res = user;
  size_t i = task_index(res, t);
  res->run_ns[i] = t->run_ns;
  res->on_elastic[i] = t->kind == TKO_WORKER_ELASTIC;
}

static void *producer_main(void *arg) {
  producer *p = arg;
  run_state *st = p->st;
  const wb_config *cfg = &st->res->cfg;
  uint64_t n = cfg->tasks;
  for (unsigned b = 0; b < cfg->bursts; b++) {
    pthread_mutex_lock(&st->mu);
    while (st->released <= b && !st->abort) pthread_cond_wait(&st->cv, &st->mu);
    bool abort = st->abort;
    pthread_mutex_unlock(&st->mu);
    if (abort) break;

    /* Flood b is tasks [lo, hi); this producer submits one slice of it. */
    uint64_t lo = n * b / cfg->bursts, hi = n * (b + 1) / cfg->bursts;
    uint64_t from = lo + (hi - lo) * p->index / cfg->producers;
    uint64_t to = lo + (hi - lo) * (p->index + 1) / cfg->producers;
    for (uint64_t i = from; i < to; i++) {
      wb_task *t = &st->res->tasks[i];
      int rc = tko_submit(st->pool, task_fn, t, t->weight);
      if (rc) {
        if (!p->errors) p->first_error = rc;
        p->errors++;
      }
    }

    pthread_mutex_lock(&st->mu);
    st->reported++;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
  }
  return NULL;
}

static void gate_abort(run_state *st) {
  pthread_mutex_lock(&st->mu);
  st->abort = true;
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->mu);
}

/* Opens flood b and waits until every producer has submitted its share. */
static void gate_run(run_state *st, unsigned b) {
  unsigned want = (b + 1) * st->res->cfg.producers;
  pthread_mutex_lock(&st->mu);
  st->released = b + 1;
  pthread_cond_broadcast(&st->cv);
  while (st->reported < want) pthread_cond_wait(&st->cv, &st->mu);
  pthread_mutex_unlock(&st->mu);
}

static int fail(const char *what, int err) {
  fprintf(stderr, "%s: %s: %s\n", WB_PROG, what, tko_strerror(err));
  return 1;
}

void wb_result_free(wb_result *res) {
  free(res->tasks);
  free(res->wait_ns);
  free(res->run_ns);
  free(res->on_elastic);
  wb_timeline_free(&res->timeline);
  memset(res, 0, sizeof *res);
}

int wb_run(const wb_config *cfg, wb_result *res) {
  memset(res, 0, sizeof *res);
  res->cfg = *cfg;
  size_t n = (size_t)cfg->tasks;
  res->tasks = malloc(n * sizeof *res->tasks);
  res->wait_ns = malloc(n * sizeof *res->wait_ns);
  res->run_ns = malloc(n * sizeof *res->run_ns);
  res->on_elastic = calloc(n, 1);
  /* 65536 samples hold 11 minutes at 10 ms before the first halving. */
  if (!res->tasks || !res->wait_ns || !res->run_ns || !res->on_elastic ||
      wb_timeline_alloc(&res->timeline, 65536) != 0)
    return fail("allocating the per-task arrays", -ENOMEM);
  memset(res->wait_ns, 0xff, n * sizeof *res->wait_ns); /* UINT64_MAX: not run */
  memset(res->run_ns, 0, n * sizeof *res->run_ns);
  res->mix_checksum = wb_mix_generate(cfg, res->tasks);
  if (cfg->task_us && cfg->io_pct < 100) spin_calibrate();

  tko_options o = cfg->pool == WB_POOL_ELASTIC
                      ? tko_elastic_options(cfg->workers, cfg->max_elastic, cfg->idle_ms)
                      : tko_basic_options(cfg->workers);
  o.name = "wb";
  o.hooks.user = res;
  o.hooks.before_run = before_run; /* hooks also turn on wait/run timing */
  o.hooks.after_run = after_run;

  run_state st;
  memset(&st, 0, sizeof st);
  st.res = res;
  pthread_mutex_init(&st.mu, NULL);
  pthread_cond_init(&st.cv, NULL);
  int rc = tko_pool_create(&st.pool, &o);
  if (rc) {
    pthread_cond_destroy(&st.cv);
    pthread_mutex_destroy(&st.mu);
    return fail("tko_pool_create", rc);
  }

  producer *prods = calloc(cfg->producers, sizeof *prods);
  wb_progress *progress = cfg->quiet ? NULL : wb_progress_new(cfg->tasks);
  wb_sampler *sampler = NULL;
  uint64_t t0 = wb_now_ns();
  if (prods) rc = wb_sampler_start(&sampler, st.pool, &res->timeline, t0, progress);
  unsigned started = 0;
  for (; prods && rc == 0 && started < cfg->producers; started++) {
    prods[started] = (producer){.st = &st, .index = started};
    rc = -pthread_create(&prods[started].thread, NULL, producer_main, &prods[started]);
    if (rc) break;
  }
  if (!prods) rc = -ENOMEM;
  if (rc) {
    gate_abort(&st);
    for (unsigned i = 0; i < started; i++) pthread_join(prods[i].thread, NULL);
    if (sampler) wb_sampler_stop(sampler);
    wb_progress_clear(progress);
    wb_progress_free(progress);
    free(prods);
    tko_pool_destroy(st.pool);
    pthread_cond_destroy(&st.cv);
    pthread_mutex_destroy(&st.mu);
    return fail("starting the producers and sampler", rc);
  }

  uint64_t alloc_base = 0;
  res->allocs_known = wb_allocs_read(&alloc_base);
  uint64_t first = 0, last = 0, active = 0;
  for (unsigned b = 0; b < cfg->bursts; b++) {
    if (b > 0 || cfg->scenario->lead_idle) wb_sleep_ns((uint64_t)cfg->gap_ms * 1000000u);
    uint64_t start = wb_now_ns();
    if (b == 0) first = start;
    gate_run(&st, b);
    tko_pool_wait_idle(st.pool, -1);
    last = wb_now_ns();
    active += last - start;
  }
  res->wall_s = (double)(last - first) * 1e-9;
  res->active_s = (double)active * 1e-9;
  for (unsigned i = 0; i < cfg->producers; i++) {
    pthread_join(prods[i].thread, NULL);
    if (prods[i].errors && !res->submit_errors) res->first_submit_error = prods[i].first_error;
    res->submit_errors += prods[i].errors;
  }
  free(prods);

  /* The tail: idle time in which elastic workers retire, on the timeline. */
  if (cfg->tail_ms > 0) wb_sleep_ns((uint64_t)cfg->tail_ms * 1000000u);
  wb_sampler_stop(sampler); /* the timeline ends before shutdown's joins */
  wb_progress_clear(progress);
  wb_progress_free(progress);
  tko_pool_stats(st.pool, &res->before_shutdown);
  tko_pool_shutdown(st.pool, TKO_DRAIN);
  tko_pool_stats(st.pool, &res->stats);
  tko_pool_destroy(st.pool);
  pthread_cond_destroy(&st.cv);
  pthread_mutex_destroy(&st.mu);

  uint64_t alloc_end = 0;
  if (res->allocs_known && wb_allocs_read(&alloc_end)) res->allocs = alloc_end - alloc_base;
  return 0;
}
