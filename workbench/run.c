/* SPDX-License-Identifier: MIT */
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
 * flood, so elastic workers have time to retire in between.
 *
 * Pool features: a producer submits one task at a time, or in task groups
 * (waiting for each), or in batches, or through timers (--delay-ms; the
 * pool is not idle until every timer has fired, so the main thread also
 * waits for a count of finished tasks that the after_run hook keeps). With
 * --async the blocking tasks are async tasks: fn hands the operation to a
 * completer thread, which completes it when the task's sleep would have
 * ended, so no worker blocks. A full reject queue makes the producer yield
 * and try again (counted as `rejected`). With --handles a producer submits
 * through task handles, N at a time (its own array, allocated up front),
 * cancels the tasks the mix marks (--cancel-pct) once all N are submitted,
 * then waits on each handle and reads its status: a cancel that returned 0
 * must end in -ECANCELED, any other in the task's own status, and a
 * contradiction is counted (`broken`, which the library promises is 0).
 *
 * Ctrl-C (interrupt.c) stops the run, promptly whatever is queued or
 * running: the producers stop submitting, the main thread's waits and idle
 * gaps end, the pool is shut down with TKO_CANCEL_NOWAIT, so the queued
 * tasks never run, and then the running tasks are cut short - a blocking
 * task's sleep is a wait on the run's halt signal, which the Ctrl-C
 * raises; a CPU task's spin looks at it between rounds; the async
 * completer completes everything it holds at once. The summary then covers
 * what ran. The queue is cancelled before the halt, so no queued task
 * starts already halted and passes for one that ran. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wb.h"

/* The run's halt signal, raised once by a Ctrl-C: the workbench's own tasks
 * stop their work at it. Set up before the pool starts and torn down after
 * it is destroyed, like the statics below. */
static struct {
  pthread_mutex_t mu; /* pairs a sleeper's look at raised with its wait */
  pthread_cond_t cv;  /* (CLOCK_MONOTONIC) broadcast when raised is set */
  /* Written under mu; read without it by the spin, where a late look costs
   * one more round of spinning and nothing else (relaxed). */
  atomic_bool raised;
} halt;

static void halt_init(void) {
  pthread_mutex_init(&halt.mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&halt.cv, &ca);
  pthread_condattr_destroy(&ca);
  atomic_init(&halt.raised, false);
}

static void halt_fini(void) {
  pthread_cond_destroy(&halt.cv);
  pthread_mutex_destroy(&halt.mu);
}

static bool halted(void) {
  return atomic_load_explicit(&halt.raised, memory_order_relaxed);
}

static void halt_raise(void) {
  pthread_mutex_lock(&halt.mu);
  atomic_store_explicit(&halt.raised, true, memory_order_relaxed);
  pthread_cond_broadcast(&halt.cv);
  pthread_mutex_unlock(&halt.mu);
}

/* A blocking task's "I/O": sleeps ns, or until the halt. raised is looked
 * at under mu and halt_raise sets it under mu before broadcasting, so the
 * broadcast cannot fall between the look and the wait. */
static void halt_sleep_ns(uint64_t ns) {
  uint64_t due = wb_now_ns() + ns;
  struct timespec ts = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
  pthread_mutex_lock(&halt.mu);
  while (!halted() && pthread_cond_timedwait(&halt.cv, &halt.mu, &ts) != ETIMEDOUT) {
  }
  pthread_mutex_unlock(&halt.mu);
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

/* A CPU task's work: spin in slices of SPIN_SLICE rounds (tens of
 * microseconds), looking at the halt between them. */
#define SPIN_SLICE 65536u
static void spin_work(uint64_t rounds) {
  while (rounds > 0 && !halted()) {
    uint64_t r = rounds < SPIN_SLICE ? rounds : SPIN_SLICE;
    spin(r);
    rounds -= r;
  }
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

/* --blocking-hint; set once before any worker starts, like the above. */
static bool blocking_hint;

static int task_fn(void *arg) {
  const wb_task *t = arg;
  if (t->work_us) {
    if (t->kind == WB_TASK_IO) {
      /* -EPERM (ignored) when a caller-runs task runs on a producer. */
      if (blocking_hint) tko_blocking_begin();
      halt_sleep_ns((uint64_t)t->work_us * 1000u);
      if (blocking_hint) tko_blocking_end();
    } else {
      spin_work((uint64_t)((double)t->work_us * spin_rounds_per_us));
    }
  }
  return t->fail ? 1 : 0;
}

/* The completer of async tasks (--async): a min-heap of operations by the
 * time their simulated I/O ends, and one thread that sleeps until the
 * earliest and completes it. The heap holds at most one entry per task,
 * so it is allocated once, before the run. */
typedef struct pending_op {
  uint64_t due_ns;
  tko_async *op;
  int status;
} pending_op;

typedef struct completer {
  pthread_t thread;
  pthread_mutex_t mu; /* guards heap, len, stop and hurry */
  pthread_cond_t cv;  /* (CLOCK_MONOTONIC) signalled on a new earliest entry, stop or hurry */
  pending_op *heap;
  size_t len, cap;
  bool stop;
  bool hurry; /* a Ctrl-C: complete every operation at once, now and later */
} completer;

/* The run's completer; set before the pool starts, like blocking_hint. */
static completer *the_completer;

static void heap_swap(pending_op *a, pending_op *b) {
  pending_op t = *a;
  *a = *b;
  *b = t;
}

static int async_fn(tko_async *op, void *arg) {
  const wb_task *t = arg;
  completer *c = the_completer;
  pending_op e = {wb_now_ns() + (uint64_t)t->work_us * 1000u, op, t->fail ? 1 : 0};
  pthread_mutex_lock(&c->mu);
  if (c->len == c->cap) { /* cannot happen: one entry per task at most */
    pthread_mutex_unlock(&c->mu);
    return -ENOMEM; /* completes the task at once, as a failure */
  }
  size_t i = c->len++;
  c->heap[i] = e;
  while (i > 0 && c->heap[(i - 1) / 2].due_ns > c->heap[i].due_ns) {
    heap_swap(&c->heap[(i - 1) / 2], &c->heap[i]);
    i = (i - 1) / 2;
  }
  if (i == 0) pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return 0;
}

static void *completer_main(void *arg) {
  completer *c = arg;
  pthread_mutex_lock(&c->mu);
  while (!c->stop || c->len > 0) {
    if (c->len == 0) {
      pthread_cond_wait(&c->cv, &c->mu);
      continue;
    }
    uint64_t now = wb_now_ns(), due = c->heap[0].due_ns;
    if (due > now && !c->stop && !c->hurry) {
      struct timespec ts = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
      pthread_cond_timedwait(&c->cv, &c->mu, &ts);
      continue;
    }
    pending_op e = c->heap[0];
    c->heap[0] = c->heap[--c->len];
    for (size_t i = 0;;) {
      size_t l = 2 * i + 1, m = i;
      if (l < c->len && c->heap[l].due_ns < c->heap[m].due_ns) m = l;
      if (l + 1 < c->len && c->heap[l + 1].due_ns < c->heap[m].due_ns) m = l + 1;
      if (m == i) break;
      heap_swap(&c->heap[i], &c->heap[m]);
      i = m;
    }
    pthread_mutex_unlock(&c->mu);
    tko_async_complete(e.op, e.status);
    pthread_mutex_lock(&c->mu);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

static int completer_start(completer *c, size_t cap) {
  memset(c, 0, sizeof *c);
  c->heap = malloc((cap ? cap : 1) * sizeof *c->heap);
  c->cap = cap;
  if (!c->heap) return -ENOMEM;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&c->mu, NULL);
  int rc = pthread_create(&c->thread, NULL, completer_main, c);
  if (rc) {
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c->heap);
    return -rc;
  }
  return 0;
}

/* From a Ctrl-C on, every operation is completed as soon as it arrives. */
static void completer_hurry(completer *c) {
  pthread_mutex_lock(&c->mu);
  c->hurry = true;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

/* Completes whatever is left at once, then joins. */
static void completer_stop(completer *c) {
  pthread_mutex_lock(&c->mu);
  c->stop = true;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  pthread_join(c->thread, NULL);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c->heap);
}

typedef struct run_state {
  wb_result *res;
  tko_pool *pool;
  /* The flood gate. mu protects released, reported and abort; cv
   * (CLOCK_MONOTONIC) signals a change in any of them, in either direction. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* Set by a Ctrl-C. Relaxed: it only makes loops stop early; the
   * results are read after the joins, which order them. */
  atomic_bool interrupted;
  unsigned released;  /* floods opened so far */
  unsigned reported;  /* producer shares submitted so far, all floods */
  bool abort;
  /* --delay-ms: tasks finished so far (after_run), and the mutex and
   * condition variable the main thread waits on for a flood's count. */
  bool count_done;
  pthread_mutex_t done_mu; /* protects done */
  pthread_cond_t done_cv;  /* broadcast when done changes */
  uint64_t done;
  tko_timer *timers;       /* one per task (--delay-ms) */
  /* --resize: written by the one producer that submits the middle task,
   * read after the producers are joined. */
  bool resized;
  int resize_rc;
  uint64_t resize_ns;
} run_state;

/* --handles: one task's handle in a producer's window, and what its cancel
 * returned (1: not tried). */
typedef struct handle_slot {
  tko_handle h;
  const wb_task *task;
  int cancel_rc;
} handle_slot;

typedef struct producer {
  pthread_t thread;
  run_state *st;
  unsigned index;
  uint64_t errors;
  int first_error;
  uint64_t rejected;  /* -EAGAIN from a full reject queue, then retried */
  uint64_t groups;    /* groups waited for */
  tko_task *batch;    /* --batch: the batch being filled */
  handle_slot *handles; /* --handles: the window's handles */
  uint64_t handles_waited, cancels_won, cancels_late, handles_cancelled, handles_broken;
} producer;

static size_t task_index(const wb_result *res, const tko_task_info *t) {
  return (size_t)((const wb_task *)t->arg - res->tasks);
}

static void before_run(void *user, const tko_task_info *t) {
  run_state *st = user;
  wb_result *res = st->res;
  res->wait_ns[task_index(res, t)] = t->wait_ns;
}

static void after_run(void *user, const tko_task_info *t) {
  run_state *st = user;
  wb_result *res = st->res;
  size_t i = task_index(res, t);
  res->run_ns[i] = t->run_ns;
  res->on_elastic[i] = t->kind == TKO_WORKER_ELASTIC;
  if (st->count_done) {
    pthread_mutex_lock(&st->done_mu);
    st->done++;
    pthread_cond_broadcast(&st->done_cv);
    pthread_mutex_unlock(&st->done_mu);
  }
}

static bool interrupted(const run_state *st) {
  return atomic_load_explicit(&st->interrupted, memory_order_relaxed);
}

static void note_error(producer *p, int rc) {
  if (interrupted(p->st)) return; /* -ESHUTDOWN after Ctrl-C is no error */
  if (!p->errors) p->first_error = rc;
  p->errors++;
}

/* A full reject queue refuses with -EAGAIN: the producer yields and tries
 * again, as a caller with nowhere else to put the work would. */
static bool retry(producer *p, int rc) {
  const wb_config *cfg = &p->st->res->cfg;
  if (rc != -EAGAIN || !cfg->capacity || cfg->full != TKO_FULL_REJECT) return false;
  p->rejected++;
  sched_yield();
  return true;
}

/* Submits task i the configured way (not batches); group may be NULL. */
static void submit_one(producer *p, uint64_t i, tko_group *group) {
  run_state *st = p->st;
  const wb_config *cfg = &st->res->cfg;
  wb_task *t = &st->res->tasks[i];
  bool as_async = cfg->async && t->kind == WB_TASK_IO;
  int rc;
  do {
    if (cfg->delay_ms)
      rc = tko_submit_after(st->pool, &st->timers[i], cfg->delay_ms, task_fn, t, t->weight);
    else if (group && as_async)
      rc = tko_group_submit_async(st->pool, group, async_fn, t, t->weight);
    else if (group)
      rc = tko_group_submit(st->pool, group, task_fn, t, t->weight);
    else if (as_async)
      rc = tko_submit_async(st->pool, async_fn, t, t->weight);
    else
      rc = tko_submit(st->pool, task_fn, t, t->weight);
  } while (rc && retry(p, rc));
  if (rc) note_error(p, rc);
}

static void flush_batch(producer *p, size_t n) {
  if (!n) return;
  int rc;
  while ((rc = tko_submit_batch(p->st->pool, p->batch, n)) != 0 && retry(p, rc)) {
  }
  if (rc && !interrupted(p->st)) {
    if (!p->errors) p->first_error = rc;
    p->errors += n;
  }
}

/* --resize: the producer whose slice holds the middle task resizes the
 * pool before submitting it (with several floods, the middle flood's
 * first task comes first in its slice: the resize then happens between
 * floods). */
static void maybe_resize(producer *p, uint64_t i) {
  run_state *st = p->st;
  const wb_config *cfg = &st->res->cfg;
  if (!cfg->resize.on || i != cfg->tasks / 2) return;
  st->resize_rc = tko_pool_resize(st->pool, cfg->resize.basic, cfg->resize.max_elastic);
  st->resize_ns = wb_now_ns();
  st->resized = true;
}

/* --handles: submits tasks [w0, w1) through the producer's handles, cancels
 * those the mix marks, then waits on each and reads its status. */
static void handle_window(producer *p, uint64_t w0, uint64_t w1) {
  run_state *st = p->st;
  size_t n = 0; /* slots [0, n) hold armed handles */
  for (uint64_t i = w0; i < w1 && !interrupted(st); i++) {
    wb_task *t = &st->res->tasks[i];
    handle_slot *s = &p->handles[n];
    maybe_resize(p, i);
    int rc;
    while ((rc = tko_submit_handle(st->pool, &s->h, task_fn, t, t->weight)) != 0 && retry(p, rc)) {
    }
    if (rc) {
      note_error(p, rc);
      continue;
    }
    s->task = t;
    s->cancel_rc = 1; /* not tried */
    n++;
  }
  for (size_t k = 0; k < n; k++) {
    handle_slot *s = &p->handles[k];
    if (!s->task->cancel) continue;
    s->cancel_rc = tko_handle_cancel(&s->h);
    if (s->cancel_rc == 0) p->cancels_won++;
    else if (s->cancel_rc == -EBUSY) p->cancels_late++;
  }
  for (size_t k = 0; k < n; k++) {
    handle_slot *s = &p->handles[k];
    if (tko_handle_wait(&s->h, -1) != 0) continue; /* cannot happen without a limit */
    p->handles_waited++;
    int status = tko_handle_status(&s->h);
    if (status == -ECANCELED) p->handles_cancelled++;
    /* Cancelled exactly when the cancel won; otherwise the task ran and
     * its status is what task_fn returned. A Ctrl-C's shutdown cancels
     * queued tasks and cuts running ones short: nothing to compare. */
    bool kept = interrupted(st) ||
                (s->cancel_rc == 0 ? status == -ECANCELED : status == (s->task->fail ? 1 : 0));
    if (!kept) p->handles_broken++;
  }
}

/* Submits tasks [from, to) in groups, through handles, in batches, or one
 * by one. */
static void submit_slice(producer *p, uint64_t from, uint64_t to) {
  run_state *st = p->st;
  const wb_config *cfg = &st->res->cfg;
  if (cfg->handles) {
    for (uint64_t w0 = from; w0 < to && !interrupted(st); w0 += cfg->handles)
      handle_window(p, w0, w0 + cfg->handles < to ? w0 + cfg->handles : to);
  } else if (cfg->groups) {
    for (uint64_t g0 = from; g0 < to; g0 += cfg->groups) {
      uint64_t g1 = g0 + cfg->groups < to ? g0 + cfg->groups : to;
      tko_group g;
      int rc = tko_group_init(&g);
      if (rc) {
        note_error(p, rc);
        continue;
      }
      for (uint64_t i = g0; i < g1 && !interrupted(st); i++) {
        maybe_resize(p, i);
        submit_one(p, i, &g);
      }
      tko_group_wait(&g, -1);
      tko_group_destroy(&g);
      p->groups++;
    }
  } else if (cfg->batch) {
    size_t n = 0;
    for (uint64_t i = from; i < to && !interrupted(st); i++) {
      wb_task *t = &st->res->tasks[i];
      maybe_resize(p, i);
      if (cfg->async && t->kind == WB_TASK_IO) { /* async tasks are not batched */
        submit_one(p, i, NULL);
        continue;
      }
      p->batch[n++] = (tko_task){task_fn, t, t->weight};
      if (n == cfg->batch) {
        flush_batch(p, n);
        n = 0;
      }
    }
    flush_batch(p, n);
  } else {
    for (uint64_t i = from; i < to && !interrupted(st); i++) {
      maybe_resize(p, i);
      submit_one(p, i, NULL);
    }
  }
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
    submit_slice(p, from, to);

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

/* Opens flood b and waits until every producer has submitted its share
 * (or a Ctrl-C aborts the run). */
static void gate_run(run_state *st, unsigned b) {
  unsigned want = (b + 1) * st->res->cfg.producers;
  pthread_mutex_lock(&st->mu);
  st->released = b + 1;
  pthread_cond_broadcast(&st->cv);
  while (st->reported < want && !st->abort) pthread_cond_wait(&st->cv, &st->mu);
  pthread_mutex_unlock(&st->mu);
}

/* Idles for ns, or until a Ctrl-C aborts the run. */
static void gate_sleep(run_state *st, uint64_t ns) {
  uint64_t due = wb_now_ns() + ns;
  struct timespec ts = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
  pthread_mutex_lock(&st->mu);
  while (!st->abort && pthread_cond_timedwait(&st->cv, &st->mu, &ts) != ETIMEDOUT) {
  }
  pthread_mutex_unlock(&st->mu);
}

/* The first Ctrl-C (on interrupt.c's watcher thread). It waits for
 * nothing: the cancel does not wait for the running tasks (the main
 * thread's shutdown does, after the halt has cut them short), and with a
 * timeout of 0 it does not wait for the main thread's own shutdown either,
 * which starts only when nothing is queued. */
static void on_interrupt(void *arg) {
  run_state *st = arg;
  atomic_store_explicit(&st->interrupted, true, memory_order_relaxed);
  gate_abort(st);
  pthread_mutex_lock(&st->done_mu); /* wakes wait_done, which checks the flag under it */
  pthread_cond_broadcast(&st->done_cv);
  pthread_mutex_unlock(&st->done_mu);
  tko_pool_shutdown_timed(st->pool, TKO_CANCEL_NOWAIT, 0);
  halt_raise();
  if (the_completer) completer_hurry(the_completer);
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

/* Frees what wb_run set up for the features (timers, batches, completer). */
static void features_free(run_state *st, producer *prods, unsigned nprods, completer *comp) {
  if (comp) completer_stop(comp);
  the_completer = NULL;
  for (unsigned i = 0; prods && i < nprods; i++) {
    free(prods[i].batch);
    free(prods[i].handles);
  }
  free(st->timers);
  st->timers = NULL;
  pthread_cond_destroy(&st->done_cv);
  pthread_mutex_destroy(&st->done_mu);
  halt_fini();
}

/* --delay-ms: waits until `target` tasks have finished (the pool is not
 * idle while timers are still to fire, so wait_idle alone is not enough). */
static void wait_done(run_state *st, uint64_t target) {
  pthread_mutex_lock(&st->done_mu);
  while (st->done < target && !interrupted(st)) pthread_cond_wait(&st->done_cv, &st->done_mu);
  pthread_mutex_unlock(&st->done_mu);
}

/* Waits for the pool to go idle, or for a Ctrl-C. The wait is cut into
 * WAIT_SLICE_MS pieces rather than left to a Ctrl-C's cancel to end: the
 * pool wakes an idle waiter at every task it cancels, so cancelling a
 * long queue goes several times faster without one. */
#define WAIT_SLICE_MS 20
static void wait_idle(run_state *st) {
  while (!interrupted(st) && tko_pool_wait_idle(st->pool, WAIT_SLICE_MS) == -ETIMEDOUT) {
  }
}

int wb_run(const wb_config *cfg, wb_interrupt *intr, wb_result *res) {
  memset(res, 0, sizeof *res);
  res->cfg = *cfg;
  size_t n = (size_t)cfg->tasks;
  res->tasks = malloc(n * sizeof *res->tasks);
  res->wait_ns = malloc(n * sizeof *res->wait_ns);
  res->run_ns = malloc(n * sizeof *res->run_ns);
  res->on_elastic = calloc(n, 1);
  if (!res->tasks || !res->wait_ns || !res->run_ns || !res->on_elastic ||
      wb_timeline_alloc(&res->timeline, WB_TIMELINE_CAP) != 0)
    return fail("allocating the per-task arrays", -ENOMEM);
  memset(res->wait_ns, 0xff, n * sizeof *res->wait_ns); /* UINT64_MAX: not run */
  memset(res->run_ns, 0, n * sizeof *res->run_ns);
  res->mix_checksum = wb_mix_generate(cfg, res->tasks);
  if (cfg->task_us && cfg->io_pct < 100) spin_calibrate();
  blocking_hint = cfg->blocking_hint;

  run_state st;
  memset(&st, 0, sizeof st);
  st.res = res;
  pthread_mutex_init(&st.mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&st.cv, &ca);
  pthread_condattr_destroy(&ca);
  atomic_init(&st.interrupted, false);
  pthread_mutex_init(&st.done_mu, NULL);
  pthread_cond_init(&st.done_cv, NULL);
  st.count_done = cfg->delay_ms > 0;
  halt_init();
  completer comp_storage, *comp = NULL;
  int rc = 0;
  if (cfg->delay_ms && !(st.timers = calloc(n, sizeof *st.timers))) rc = -ENOMEM;
  if (rc == 0 && cfg->async) {
    rc = completer_start(&comp_storage, n);
    if (rc == 0) comp = the_completer = &comp_storage;
  }
  if (rc) {
    features_free(&st, NULL, 0, comp);
    wb_interrupt_stop(intr);
    pthread_cond_destroy(&st.cv);
    pthread_mutex_destroy(&st.mu);
    return fail("setting up timers or the async completer", rc);
  }

  tko_options o = cfg->pool == WB_POOL_ELASTIC
                      ? tko_elastic_options(cfg->workers, cfg->max_elastic, cfg->idle_ms)
                      : tko_basic_options(cfg->workers);
  o.name = cfg->thread_name ? cfg->thread_name : "wb";
  o.hooks.user = &st;
  o.hooks.before_run = before_run; /* hooks also turn on wait/run timing */
  o.hooks.after_run = after_run;
  o.queue_capacity = (size_t)cfg->capacity;
  o.full_policy = cfg->full;
  o.aging_ms = cfg->aging_ms;
  o.max_async_inflight = cfg->max_async;
  if (cfg->resize.on) { /* room for the size it grows to */
    unsigned now = o.workers + o.max_elastic, later = cfg->resize.basic + cfg->resize.max_elastic;
    o.max_threads = now > later ? now : later;
  }

  rc = tko_pool_create(&st.pool, &o);
  if (rc == 0) rc = wb_interrupt_watch(intr, on_interrupt, &st);
  if (rc) {
    if (st.pool) tko_pool_destroy(st.pool);
    features_free(&st, NULL, 0, comp);
    wb_interrupt_stop(intr);
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
    if (cfg->batch && !(prods[started].batch = malloc(cfg->batch * sizeof(tko_task)))) {
      rc = -ENOMEM;
      break;
    }
    if (cfg->handles &&
        !(prods[started].handles = malloc(cfg->handles * sizeof(handle_slot)))) {
      free(prods[started].batch);
      prods[started].batch = NULL;
      rc = -ENOMEM;
      break;
    }
    rc = -pthread_create(&prods[started].thread, NULL, producer_main, &prods[started]);
    if (rc) {
      free(prods[started].batch);
      free(prods[started].handles);
      prods[started].batch = NULL;
      prods[started].handles = NULL;
      break;
    }
  }
  if (!prods) rc = -ENOMEM;
  if (rc) {
    gate_abort(&st);
    for (unsigned i = 0; i < started; i++) pthread_join(prods[i].thread, NULL);
    if (sampler) wb_sampler_stop(sampler);
    wb_progress_clear(progress);
    wb_progress_free(progress);
    wb_interrupt_stop(intr);
    tko_pool_destroy(st.pool);
    features_free(&st, prods, started, comp);
    free(prods);
    pthread_cond_destroy(&st.cv);
    pthread_mutex_destroy(&st.mu);
    return fail("starting the producers and sampler", rc);
  }

  uint64_t alloc_base = 0;
  res->allocs_known = wb_allocs_read(&alloc_base);
  uint64_t first = 0, last = 0, active = 0;
  for (unsigned b = 0; b < cfg->bursts && !interrupted(&st); b++) {
    if (b > 0 || cfg->scenario->lead_idle) gate_sleep(&st, (uint64_t)cfg->gap_ms * 1000000u);
    uint64_t start = wb_now_ns();
    if (b == 0) first = start;
    gate_run(&st, b);
    if (st.count_done) {
      /* Every task of floods 0..b, less those refused; the producers wrote
       * their counts before reporting under st.mu, which gate_run took. */
      uint64_t refused = 0;
      for (unsigned i = 0; i < cfg->producers; i++) refused += prods[i].errors;
      wait_done(&st, cfg->tasks * (b + 1) / cfg->bursts - refused);
    }
    wait_idle(&st);
    last = wb_now_ns();
    active += last - start;
  }
  if (!first) first = last = wb_now_ns(); /* interrupted before the first flood */
  res->wall_s = (double)(last - first) * 1e-9;
  res->active_s = (double)active * 1e-9;
  for (unsigned i = 0; i < cfg->producers; i++) {
    pthread_join(prods[i].thread, NULL);
    if (prods[i].errors && !res->submit_errors) res->first_submit_error = prods[i].first_error;
    res->submit_errors += prods[i].errors;
    res->rejected += prods[i].rejected;
    res->groups_waited += prods[i].groups;
    res->handles_waited += prods[i].handles_waited;
    res->cancels_won += prods[i].cancels_won;
    res->cancels_late += prods[i].cancels_late;
    res->handles_cancelled += prods[i].handles_cancelled;
    res->handles_broken += prods[i].handles_broken;
  }
  res->resized = st.resized; /* the joins order the producer's writes */
  res->resize_rc = st.resize_rc;
  res->resize_at_s = st.resized ? (double)(st.resize_ns - first) * 1e-9 : 0;

  /* The tail: idle time in which elastic workers retire, on the timeline. */
  if (cfg->tail_ms > 0) gate_sleep(&st, (uint64_t)cfg->tail_ms * 1000000u);
  wb_sampler_stop(sampler); /* the timeline ends before shutdown's joins */
  wb_progress_clear(progress);
  wb_progress_free(progress);
  tko_pool_stats(st.pool, &res->before_shutdown);
  /* Shutdown waits for async tasks in flight: the completer still runs.
   * After a Ctrl-C it waits for the running tasks the halt cut short, and
   * cancels anything a submit racing with the watcher's cancel queued. */
  tko_pool_shutdown(st.pool, interrupted(&st) ? TKO_CANCEL : TKO_DRAIN);
  res->interrupted = wb_interrupt_stop(intr);
  tko_pool_stats(st.pool, &res->stats);
  tko_pool_destroy(st.pool);
  features_free(&st, prods, cfg->producers, comp);
  free(prods);
  pthread_cond_destroy(&st.cv);
  pthread_mutex_destroy(&st.mu);

  uint64_t alloc_end = 0;
  if (res->allocs_known && wb_allocs_read(&alloc_end)) res->allocs = alloc_end - alloc_base;
  return 0;
}
