/* SPDX-License-Identifier: MIT */
/* One flood shape at a time, for A/B runs of two builds: a million empty
 * tasks with weights 0-3 interleaved, end to end (first submit to
 * tko_pool_wait_idle), 2 workers. Prints ns/task per run, with the backlog
 * left when the submitting ended.
 *   probe_flood batch  fresh|reused RUNS    one producer, tko_submit_batch of 256
 *   probe_flood submit PRODUCERS RUNS [CAP] PRODUCERS threads of tko_submit, a
 *                                           fresh pool per run; CAP > 0: a bounded
 *                                           queue of CAP tasks (full policy BLOCK)
 *   probe_flood submit-reused PRODUCERS RUNS  the same on one pool, after a
 *                                           warm-up run: its queue's memory is
 *                                           already touched (a fresh pool's
 *                                           backlog faults its pages in) */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "probe_common.h"
#include "taskorch.h"

enum { TASKS = 1000000, BATCH = 256 };

static int empty(void *arg) {
  (void)arg;
  return 0;
}

static tko_pool *make_pool(long capacity) {
  tko_options o = tko_basic_options(2);
  o.queue_capacity = (size_t)capacity;
  tko_pool *p = NULL;
  if (tko_pool_create(&p, &o)) exit(1);
  return p;
}

static void report(tko_pool *p, const char *label, uint64_t t0, uint64_t submitted_at) {
  tko_stats s;
  tko_pool_stats(p, &s);
  uint64_t backlog = s.queued;
  tko_pool_wait_idle(p, -1);
  uint64_t end = probe_now_ns();
  printf("%s%.1f ns/task (submitting ended at %.0f%% of the run, %llu queued then)\n",
         label, (double)(end - t0) / TASKS, 100.0 * (double)(submitted_at - t0) / (double)(end - t0),
         (unsigned long long)backlog);
}

static void batch_run(tko_pool *p, const char *label) {
  static tko_task b[BATCH];
  uint64_t t0 = probe_now_ns();
  for (long i = 0; i < TASKS; i += BATCH) {
    for (int j = 0; j < BATCH; j++) b[j] = (tko_task){empty, NULL, (int)((i + j) & 3)};
    if (tko_submit_batch(p, b, BATCH)) exit(1);
  }
  report(p, label, t0, probe_now_ns());
}

typedef struct producer {
  tko_pool *pool;
  long tasks, id;
  pthread_barrier_t *go;
} producer;

static void *produce(void *arg) {
  producer *pr = arg;
  pthread_barrier_wait(pr->go);
  for (long i = 0; i < pr->tasks; i++)
    if (tko_submit(pr->pool, empty, NULL, (int)((i + pr->id) & 3))) exit(1);
  return NULL;
}

static void submit_run(tko_pool *p, long n, const char *label) {
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, (unsigned)n + 1);
  pthread_t th[64];
  producer pr[64];
  for (long i = 0; i < n; i++) {
    pr[i] = (producer){p, TASKS / n, i, &go};
    pthread_create(&th[i], NULL, produce, &pr[i]);
  }
  pthread_barrier_wait(&go);
  uint64_t t0 = probe_now_ns();
  for (long i = 0; i < n; i++) pthread_join(th[i], NULL);
  report(p, label, t0, probe_now_ns());
  pthread_barrier_destroy(&go);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "batch";
  if (strcmp(mode, "submit") == 0) {
    long n = probe_arg(argc, argv, 2, 4), runs = probe_arg(argc, argv, 3, 5);
    long capacity = probe_arg(argc, argv, 4, 0);
    if (n < 1 || n > 64 || capacity < 0) return 2;
    for (long r = 0; r < runs; r++) {
      tko_pool *p = make_pool(capacity);
      submit_run(p, n, "");
      tko_pool_destroy(p);
    }
    return 0;
  }
  if (strcmp(mode, "submit-reused") == 0) {
    long n = probe_arg(argc, argv, 2, 4), runs = probe_arg(argc, argv, 3, 5);
    if (n < 1 || n > 64) return 2;
    tko_pool *p = make_pool(0);
    /* A backlog of every task at once: the queue grows to its largest. */
    tko_pool_pause(p);
    for (long i = 0; i < TASKS; i++)
      if (tko_submit(p, empty, NULL, (int)(i & 3))) exit(1);
    tko_pool_resume(p);
    tko_pool_wait_idle(p, -1);
    for (long r = 0; r < runs; r++) submit_run(p, n, "");
    tko_pool_destroy(p);
    return 0;
  }
  int reused = argc > 2 && strcmp(argv[2], "reused") == 0;
  long runs = probe_arg(argc, argv, 3, 5);
  tko_pool *p = reused ? make_pool(0) : NULL;
  if (reused) batch_run(p, "warm-up (the queue grows), not counted: ");
  for (long r = 0; r < runs; r++) {
    if (!reused) p = make_pool(0);
    batch_run(p, "");
    if (!reused) tko_pool_destroy(p);
  }
  if (reused) tko_pool_destroy(p);
  return 0;
}
