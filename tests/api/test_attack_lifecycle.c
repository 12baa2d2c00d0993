/* SPDX-License-Identifier: MIT */
/* Shutdown, destroy, pause and resize racing many submitters: kept from
 * the attack on this stop's wake-up change (a helper's program written
 * against the public header only; it found nothing here in 530 rounds,
 * 15.1 M tasks). Each round picks a pool (basic, elastic, elastic-only,
 * bounded under each full policy), more submitter threads than cores
 * (single submits, timed ones, batches; some tasks submit a child), a
 * thread that pauses and resumes, one that resizes, and a way to stop
 * (DRAIN, CANCEL, a timed DRAIN then CANCEL, CANCEL_NOWAIT, a 1 ms DRAIN,
 * or plain destroy). Every accepted task runs or reaches on_cancel exactly
 * once, and a refused one neither; shutdown and destroy return as
 * documented. Seeded: TKO_ATTACK_SEED replays. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_sync.h"

#define MAXT (1u << 20)

static struct {
  _Atomic unsigned char ran[MAXT], canc[MAXT], acc[MAXT];
  atomic_uint next_id;
  atomic_int stop_aux, doubles, odd_rc, shut_seen;
  tko_pool *pool;
  int per_submitter;
} L;

static void pause_us(uint64_t us) {
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static int task(void *arg);

/* One submit of a fresh id; from a task, a plain one, else timed. */
static void submit_one(uint64_t r, bool from_task) {
  unsigned id = atomic_fetch_add(&L.next_id, 1);
  if (id >= MAXT) return;
  void *arg = (void *)(uintptr_t)id;
  int rc = from_task ? tko_submit(L.pool, task, arg, (int)(r % 5))
                     : tko_submit_timed(L.pool, task, arg, (int)(r % 5), 50);
  if (rc == 0) atomic_store(&L.acc[id], 1);
  else if (rc == -ESHUTDOWN) atomic_store(&L.shut_seen, 1);
  else if (rc != -EAGAIN && rc != -ETIMEDOUT) atomic_store(&L.odd_rc, rc);
}

static int task(void *arg) {
  unsigned id = (unsigned)(uintptr_t)arg;
  if (atomic_fetch_add(&L.ran[id], 1) != 0) atomic_fetch_add(&L.doubles, 1);
  if ((id * 2654435761u) % 8 == 0) submit_one(id, true);
  if (id % 97 == 0) pause_us(200); /* a longer task now and then */
  return 0;
}

static void on_cancel(void *user, const tko_task_info *t) {
  (void)user;
  if (t->fn != task) return;
  unsigned id = (unsigned)(uintptr_t)t->arg;
  if (atomic_fetch_add(&L.canc[id], 1) != 0) atomic_fetch_add(&L.doubles, 1);
}

static void *submitter(void *arg) {
  uint64_t seed = (uint64_t)(uintptr_t)arg;
  for (int i = 0; i < L.per_submitter && !atomic_load(&L.shut_seen); i++) {
    if (i % 16 == 15) {
      tko_task ts[4];
      unsigned ids[4];
      for (int k = 0; k < 4; k++) {
        ids[k] = atomic_fetch_add(&L.next_id, 1);
        if (ids[k] >= MAXT) return NULL;
        ts[k] = (tko_task){task, (void *)(uintptr_t)ids[k], k};
      }
      int rc = tko_submit_batch(L.pool, ts, 4);
      if (rc == 0) for (int k = 0; k < 4; k++) atomic_store(&L.acc[ids[k]], 1);
      else if (rc == -ESHUTDOWN) atomic_store(&L.shut_seen, 1);
      else if (rc != -EAGAIN && rc != -ETIMEDOUT) atomic_store(&L.odd_rc, rc);
    } else {
      submit_one(tt_rand(&seed), false);
    }
    if (tt_rand(&seed) % 64 == 0) pause_us(tt_rand(&seed) % 300);
  }
  return NULL;
}

static void *pauser(void *arg) {
  uint64_t seed = (uint64_t)(uintptr_t)arg;
  while (!atomic_load(&L.stop_aux)) {
    tko_pool_pause(L.pool);
    pause_us(tt_rand(&seed) % 500);
    tko_pool_resume(L.pool);
    pause_us(tt_rand(&seed) % 1500);
  }
  tko_pool_resume(L.pool);
  return NULL;
}

static void *resizer(void *arg) {
  uint64_t seed = (uint64_t)(uintptr_t)arg;
  while (!atomic_load(&L.stop_aux)) {
    int rc = tko_pool_resize(L.pool, 1 + (unsigned)(tt_rand(&seed) % 4), (unsigned)(tt_rand(&seed) % 4));
    if (rc == -ESHUTDOWN) break;
    if (rc) atomic_store(&L.odd_rc, rc);
    pause_us(tt_rand(&seed) % 2000);
  }
  return NULL;
}

static tko_options pool_kind(int kind) {
  tko_options o;
  switch (kind) {
  case 0: o = tko_basic_options(2); break;
  case 1: o = tko_elastic_options(1, 3, 5); break;
  case 2: o = tko_basic_options(2); o.queue_capacity = 64; o.full_policy = TKO_FULL_BLOCK; break;
  case 3: o = tko_basic_options(1); o.queue_capacity = 32; o.full_policy = TKO_FULL_REJECT; break;
  case 4: o = tko_basic_options(2); o.queue_capacity = 16; o.full_policy = TKO_FULL_CALLER_RUNS; break;
  case 5: o = tko_elastic_options(0, 3, 2); break;
  default:
    o = tko_elastic_options(1, 2, 3);
    o.queue_capacity = 128;
    o.full_policy = TKO_FULL_BLOCK;
    break;
  }
  o.hooks.on_cancel = on_cancel;
  o.max_threads = 16;
  return o;
}

/* Totals over the rounds: the test is not vacuous. */
static uint64_t total_accepted, total_cancelled;

static void one_round(int round, uint64_t *seed) {
  memset((void *)L.ran, 0, sizeof L.ran);
  memset((void *)L.canc, 0, sizeof L.canc);
  memset((void *)L.acc, 0, sizeof L.acc);
  atomic_store(&L.next_id, 0);
  atomic_store(&L.stop_aux, 0);
  atomic_store(&L.shut_seen, 0);
  int kind = (int)(tt_rand(seed) % 7), stop = (int)(tt_rand(seed) % 6);
  tko_options o = pool_kind(kind);
  cr_assert_eq(tko_pool_create(&L.pool, &o), 0);
  int nsub = 4 + (int)(tt_rand(seed) % 5);
  bool use_pause = tt_rand(seed) % 2, use_resize = tt_rand(seed) % 2;
  pthread_t th[8], pa, rs;
  if (use_pause) cr_assert_eq(tko_pool_pause(L.pool), 0);
  for (int i = 0; i < nsub; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, submitter, (void *)(uintptr_t)(tt_rand(seed) | 1)), 0);
  if (use_pause) cr_assert_eq(pthread_create(&pa, NULL, pauser, (void *)(uintptr_t)(tt_rand(seed) | 1)), 0);
  if (use_resize) cr_assert_eq(pthread_create(&rs, NULL, resizer, (void *)(uintptr_t)(tt_rand(seed) | 1)), 0);
  pause_us(tt_rand(seed) % 5000); /* let some work in first */
  int a = 0, b = 0;
  switch (stop) {
  case 0: a = tko_pool_shutdown(L.pool, TKO_DRAIN); break;
  case 1: a = tko_pool_shutdown(L.pool, TKO_CANCEL); break;
  case 2:
    a = tko_pool_shutdown_timed(L.pool, TKO_DRAIN, 0);
    b = tko_pool_shutdown(L.pool, TKO_CANCEL);
    break;
  case 3: a = tko_pool_shutdown_timed(L.pool, TKO_CANCEL_NOWAIT, 0); break;
  case 4: a = tko_pool_shutdown_timed(L.pool, TKO_DRAIN, 1); break;
  default: break; /* plain destroy */
  }
  atomic_store(&L.stop_aux, 1);
  for (int i = 0; i < nsub; i++) cr_assert_eq(pthread_join(th[i], NULL), 0);
  if (use_pause) cr_assert_eq(pthread_join(pa, NULL), 0);
  if (use_resize) cr_assert_eq(pthread_join(rs, NULL), 0);
  cr_assert_eq(tko_pool_destroy(L.pool), 0, "round %d kind %d stop %d", round, kind, stop);
  cr_assert(stop > 1 || a == 0, "round %d kind %d stop %d: shutdown %d", round, kind, stop, a);
  cr_assert(stop != 2 || ((a == 0 || a == -ETIMEDOUT) && b == 0), "round %d: timed %d, cancel %d",
            round, a, b);
  cr_assert(stop != 4 || a == 0 || a == -ETIMEDOUT, "round %d: 1 ms drain %d", round, a);
  cr_assert_eq(atomic_load(&L.odd_rc), 0, "round %d kind %d: an undocumented return code", round,
               kind);
  cr_assert_eq(atomic_load(&L.doubles), 0, "round %d kind %d: a task ran or was cancelled twice",
               round, kind);
  unsigned n = atomic_load(&L.next_id);
  if (n > MAXT) n = MAXT;
  for (unsigned i = 0; i < n; i++) {
    unsigned acc = L.acc[i], seen = (unsigned)L.ran[i] + L.canc[i];
    cr_assert_eq(seen, acc, "round %d kind %d stop %d pause %d resize %d: id %u accepted %u, ran "
                 "or cancelled %u times", round, kind, stop, use_pause, use_resize, i, acc, seen);
    total_accepted += acc;
    total_cancelled += L.canc[i];
  }
}

Test(attack_lifecycle, pause_and_resize_race_every_shutdown) {
  const char *s = getenv("TKO_ATTACK_SEED");
  uint64_t seed = s ? strtoull(s, NULL, 10) | 1 : 0x5eed5eedull;
  L.per_submitter = TT_SCALE(20000, 2000);
  for (int round = 0; round < TT_SCALE(30, 10); round++) one_round(round, &seed);
  cr_assert_gt(total_accepted, 1000, "%llu tasks accepted", (unsigned long long)total_accepted);
  cr_assert_gt(total_cancelled, 0, "no task was ever cancelled");
  if (getenv("TKO_ATTACK_VERBOSE"))
    fprintf(stderr, "accepted %llu, cancelled %llu\n", (unsigned long long)total_accepted,
            (unsigned long long)total_cancelled);
}
