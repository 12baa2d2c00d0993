/* SPDX-License-Identifier: MIT */
/* White-box checks of admission's chunks (src/admit.c): a lease never
 * takes room_taken past the capacity (chunks shrink near the bound, to
 * nothing at it); a full queue has taken every lease back; and once the
 * pool is idle, room_taken holds exactly the give-backs workers have
 * gathered and not settled - no room is lost or counted twice. */
#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"
#include "taskorch.h"
#include "tko_test.h"

enum { CAP = 256, THREADS = 8, PER = 20 };

static int nothing(void *arg) {
  (void)arg;
  return 0;
}

static size_t taken(tko_pool *pool) { return atomic_load(&pool->room_taken); }

static size_t credits(tko_pool *pool) {
  size_t sum = 0;
  for (unsigned i = 0; i < atomic_load(&pool->rings.count); i++)
    sum += atomic_load(&pool->rings.ring[i]->credits);
  return sum;
}

static size_t unsettled(tko_pool *pool) {
  size_t sum = 0;
  for (unsigned i = 0; i < pool->nslots; i++)
    sum += atomic_load(&pool->slots[i].room_given) - atomic_load(&pool->slots[i].room_settled);
  return sum;
}

typedef struct submitter {
  tko_pool *pool;
  int bad;
} submitter;

static void *submit_some(void *arg) {
  submitter *s = arg;
  for (int i = 0; i < PER; i++) {
    if (tko_submit(s->pool, nothing, NULL, 0)) s->bad++;
    if (taken(s->pool) > CAP) s->bad++;
  }
  return NULL;
}

Test(admit, leases_stay_within_the_bound_and_all_room_comes_back) {
  tko_options o = tko_basic_options(4);
  o.queue_capacity = CAP;
  o.full_policy = TKO_FULL_REJECT;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  cr_assert_eq(tko_pool_pause(pool), 0);
  /* One thread after another: each leases beside its submits. */
  for (int t = 0; t < THREADS; t++) {
    submitter s = {pool, 0};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, submit_some, &s), 0);
    cr_assert_eq(pthread_join(th, NULL), 0);
    cr_assert_eq(s.bad, 0, "a lease took room_taken past the capacity (thread %d)", t);
  }
  cr_assert_gt(credits(pool), 0, "the threads leased room ahead");
  int n = THREADS * PER, rc;
  while ((rc = tko_submit(pool, nothing, NULL, 0)) == 0) {
    n++;
    cr_assert_leq(taken(pool), CAP);
  }
  cr_assert_eq(rc, -EAGAIN);
  cr_assert_eq(n, CAP, "the queue took %d of %d", n, CAP);
  cr_assert_eq(taken(pool), CAP);
  cr_assert_eq(credits(pool), 0, "a full queue has taken every lease back");
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  /* Idle: nothing queued, no lease out; what room_taken still holds is
   * exactly what workers gathered and have not settled. */
  cr_assert_eq(credits(pool), 0);
  cr_assert_eq(taken(pool), unsettled(pool));
  cr_assert_eq(tko_pool_destroy(pool), 0);
}
