/* SPDX-License-Identifier: MIT */
/* Thread placement (tko_options.cpus, .ncpus, .stack_size): every worker,
 * basic and elastic, runs on the CPUs asked for with the stack asked for,
 * as the worker itself reports (pthread_getaffinity_np and
 * pthread_getattr_np inside a task); bad values are -EINVAL. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <taskorch.h>
#include <unistd.h>

#include "tko_test.h"
#include "tko_test_sync.h"

/* What one task saw of its worker. */
typedef struct report {
  cpu_set_t cpus;
  size_t stack;
  unsigned worker;
  tko_worker_kind kind;
} report;

typedef struct reports {
  report r[16];
  atomic_uint n;
  tt_pin pin; /* holds every task until all have reported, so each worker takes one */
} reports;

static _Thread_local const tko_task_info *tl_task;
static void remember(void *user, const tko_task_info *t) {
  (void)user;
  tl_task = t;
}

static int report_fn(void *arg) {
  reports *rs = arg;
  unsigned i = atomic_fetch_add(&rs->n, 1);
  if (i < 16) {
    report *r = &rs->r[i];
    pthread_getaffinity_np(pthread_self(), sizeof r->cpus, &r->cpus);
    pthread_attr_t a;
    pthread_getattr_np(pthread_self(), &a);
    pthread_attr_getstacksize(&a, &r->stack);
    pthread_attr_destroy(&a);
    r->worker = tl_task->worker;
    r->kind = tl_task->kind;
  }
  return tt_pin_fn(&rs->pin);
}

/* The CPUs this thread may use, lowest first; at least one. */
static size_t allowed_cpus(unsigned *out, size_t max) {
  cpu_set_t s;
  cr_assert_eq(sched_getaffinity(0, sizeof s, &s), 0);
  size_t n = 0;
  for (unsigned c = 0; c < CPU_SETSIZE && n < max; c++)
    if (CPU_ISSET(c, &s)) out[n++] = c;
  cr_assert_geq(n, 1);
  return n;
}

/* Runs one task per worker (2 basic + 2 elastic, each pinned by the gate so
 * that the next task needs another worker) and returns their reports. */
static void run_reports(tko_options *o, reports *rs) {
  memset(rs, 0, sizeof *rs);
  rs->pin = (tt_pin)TT_PIN_INIT;
  o->hooks.before_run = remember;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, o), 0);
  unsigned workers = o->workers + o->max_elastic;
  for (unsigned i = 0; i < workers; i++) {
    cr_assert_eq(tko_submit(pool, report_fn, rs, 0), 0);
    cr_assert(tt_count_wait_geq(&rs->pin.started, (long)i + 1)); /* a new worker took it */
  }
  tt_gate_open(&rs->pin.gate);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(atomic_load(&rs->n), workers);
}

Test(placement, workers_run_on_the_cpus_asked_for) {
  unsigned cpus[CPU_SETSIZE];
  size_t n = allowed_cpus(cpus, CPU_SETSIZE);
  /* One CPU (the last allowed), then every allowed CPU. */
  for (int round = 0; round < 2; round++) {
    tko_options o = tko_elastic_options(2, 2, 60000);
    const unsigned *set = round == 0 ? &cpus[n - 1] : cpus;
    size_t count = round == 0 ? 1 : n;
    o.cpus = set;
    o.ncpus = count;
    reports rs;
    run_reports(&o, &rs);
    unsigned elastic = 0;
    for (unsigned i = 0; i < 4; i++) {
      cr_assert_eq(CPU_COUNT(&rs.r[i].cpus), (int)count);
      for (size_t k = 0; k < count; k++) cr_assert(CPU_ISSET(set[k], &rs.r[i].cpus));
      elastic += rs.r[i].kind == TKO_WORKER_ELASTIC;
    }
    cr_assert_eq(elastic, 2); /* elastic workers are placed too */
  }
}

Test(placement, the_cpu_list_need_not_outlive_create) {
  unsigned cpus[CPU_SETSIZE];
  size_t n = allowed_cpus(cpus, CPU_SETSIZE);
  unsigned one[1] = {cpus[0]};
  tko_options o = tko_elastic_options(1, 1, 60000);
  o.cpus = one;
  o.ncpus = 1;
  reports rs;
  memset(&rs, 0, sizeof rs);
  rs.pin = (tt_pin)TT_PIN_INIT;
  o.hooks.before_run = remember;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  one[0] = cpus[n - 1] + 1; /* scribbled over after create */
  cr_assert_eq(tko_submit(pool, report_fn, &rs, 0), 0);
  cr_assert(tt_count_wait_geq(&rs.pin.started, 1));
  cr_assert_eq(tko_submit(pool, report_fn, &rs, 0), 0); /* an elastic worker, started now */
  cr_assert(tt_count_wait_geq(&rs.pin.started, 2));
  tt_gate_open(&rs.pin.gate);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(CPU_COUNT(&rs.r[i].cpus), 1);
    cr_assert(CPU_ISSET(cpus[0], &rs.r[i].cpus));
  }
}

Test(placement, workers_get_the_stack_size_asked_for) {
  size_t want = (size_t)1 << 20 | (size_t)64 << 10; /* 1 MiB + 64 KiB */
  tko_options o = tko_elastic_options(2, 2, 60000);
  o.stack_size = want;
  reports rs;
  run_reports(&o, &rs);
  for (unsigned i = 0; i < 4; i++) {
    cr_assert_geq(rs.r[i].stack, want);
    cr_assert_lt(rs.r[i].stack, want + ((size_t)64 << 10)); /* page rounding at most */
  }
  /* The default differs (8 MiB on Linux): the option really changed it. */
  o.stack_size = 0;
  run_reports(&o, &rs);
  for (unsigned i = 0; i < 4; i++) cr_assert_geq(rs.r[i].stack, want + ((size_t)64 << 10));
}

/* A size that is not a whole number of pages is rounded up to one, never
 * down: every worker gets at least what was asked. */
Test(placement, a_stack_size_is_rounded_up_to_whole_pages) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t want = ((size_t)1 << 20) + 1; /* 1 MiB and one byte */
  size_t rounded = (want + page - 1) / page * page;
  tko_options o = tko_elastic_options(2, 2, 60000);
  o.stack_size = want;
  reports rs;
  run_reports(&o, &rs);
  for (unsigned i = 0; i < 4; i++)
    cr_assert_geq(rs.r[i].stack, rounded, "worker %u got a %zu-byte stack for %zu asked", i,
                  rs.r[i].stack, want);
}

/* A stack the system cannot give fails create with -EAGAIN (the header's
 * "a thread could not be started"), whole: no pool, nothing started. */
Test(placement, a_stack_size_the_system_cannot_give_is_eagain) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t sizes[] = {
      SIZE_MAX,                   /* whole pages of it overflow size_t */
      SIZE_MAX - page + 2,        /* so do these */
      SIZE_MAX / 2 + 1,           /* whole pages, beyond any address space */
      (size_t)1 << (sizeof(size_t) * 8 - 2),
  };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    tko_options o = tko_elastic_options(1, 1, 60000);
    o.stack_size = sizes[i];
    tko_pool *pool = (tko_pool *)&o;
    cr_assert_eq(tko_pool_create(&pool, &o), -EAGAIN, "stack_size %zu", sizes[i]);
    cr_assert_null(pool);
  }
}

Test(placement, bad_values_are_einval) {
  tko_pool *pool = NULL;
  unsigned cpus[1] = {0};
  tko_options o = tko_basic_options(1);
  o.cpus = cpus;
  o.ncpus = 0; /* an empty set */
  cr_assert_eq(tko_pool_create(&pool, &o), -EINVAL);
  o.ncpus = 1;
  cpus[0] = TKO_MAX_CPUS; /* out of range */
  cr_assert_eq(tko_pool_create(&pool, &o), -EINVAL);
  /* Out of range beside a CPU this thread may use: still refused. */
  cpu_set_t s;
  cr_assert_eq(sched_getaffinity(0, sizeof s, &s), 0);
  unsigned usable = 0;
  while (usable + 1 < TKO_MAX_CPUS && !CPU_ISSET(usable, &s)) usable++;
  unsigned two[2] = {usable, TKO_MAX_CPUS};
  o.cpus = two;
  o.ncpus = 2;
  cr_assert_eq(tko_pool_create(&pool, &o), -EINVAL, "CPU %u (TKO_MAX_CPUS) was accepted",
               TKO_MAX_CPUS);
  o.cpus = cpus;
  o.ncpus = 1;
  /* In range, but none this thread may use. */
  unsigned outside = TKO_MAX_CPUS - 1;
  while (outside > 0 && CPU_ISSET(outside, &s)) outside--;
  cpus[0] = outside;
  if (!CPU_ISSET(outside, &s)) cr_assert_eq(tko_pool_create(&pool, &o), -EINVAL);
  o = tko_basic_options(1);
  o.ncpus = 2; /* a count without a list */
  cr_assert_eq(tko_pool_create(&pool, &o), -EINVAL);
  o = tko_basic_options(1);
  o.stack_size = TKO_MIN_STACK_SIZE - 1;
  cr_assert_eq(tko_pool_create(&pool, &o), -EINVAL);
  o.stack_size = 1;
  cr_assert_eq(tko_pool_create(&pool, &o), -EINVAL);
  cr_assert_null(pool);
  o.stack_size = TKO_MIN_STACK_SIZE; /* the least accepted */
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_submit(pool, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}
