/* SPDX-License-Identifier: MIT */
/* Unit tests for the sleep/wake signal (src/structures/signal.h): the parker's permit
 * semantics within a thread and across threads, and the idle word's
 * searching/sleeping counts through search, sleep_prepare, sleep_cancel,
 * wake_one and wake_all, including the Dekker handshake that must never
 * lose a wake-up. */
#include <stdatomic.h>
#include <stdlib.h>

#include "tko_test.h"
#include "tko_test_sync.h"
#include "tko_signal.h"

/* Long enough that reaching it means a lost wake-up, not a slow machine. */
#define PARK_LIMIT_NS (20ull * 1000000000u)

static uint64_t state_of(tko__idle *idle) { return atomic_load(&idle->state); }

Test(signal, permit_before_park_returns_at_once) {
  tko__parker pk;
  cr_assert_eq(tko__parker_init(&pk), 0);
  tko__parker_unpark(&pk);
  /* No limit: if the permit were lost this would hang, so bound it. */
  cr_assert(tko__parker_park(&pk, PARK_LIMIT_NS));
  tko__parker_fini(&pk);
}

Test(signal, park_without_permit_times_out) {
  tko__parker pk;
  cr_assert_eq(tko__parker_init(&pk), 0);
  cr_assert_not(tko__parker_park(&pk, 1000000)); /* 1 ms */
  cr_assert_not(tko__parker_park(&pk, 0), "a zero timeout just checks");
  tko__parker_fini(&pk);
}

Test(signal, permit_is_binary_and_consumed) {
  tko__parker pk;
  cr_assert_eq(tko__parker_init(&pk), 0);
  tko__parker_unpark(&pk);
  tko__parker_unpark(&pk); /* a second permit does not accumulate */
  cr_assert(tko__parker_park(&pk, 0));
  cr_assert_not(tko__parker_park(&pk, 1000000));
  tko__parker_unpark(&pk);
  cr_assert(tko__parker_park(&pk, 0));
  tko__parker_fini(&pk);
}

typedef struct park_ctx {
  tko__parker pk;
  tt_count ready;
  atomic_int result; /* 1 = woke with a permit, 0 = timed out */
} park_ctx;

static void *parks_once(void *arg) {
  park_ctx *c = arg;
  tt_count_add(&c->ready, 1);
  atomic_store(&c->result, tko__parker_park(&c->pk, PARK_LIMIT_NS) ? 1 : 0);
  return NULL;
}

Test(signal, cross_thread_unpark_wakes) {
  const int rounds = TT_SCALE(2000, 200);
  for (int r = 0; r < rounds; r++) {
    park_ctx c;
    cr_assert_eq(tko__parker_init(&c.pk), 0);
    tt_count_init(&c.ready);
    atomic_init(&c.result, -1);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, parks_once, &c), 0);
    /* Unpark after the thread announced itself: it is then parked or about
     * to park; both must end in a wake-up. */
    cr_assert(tt_count_wait_geq(&c.ready, 1));
    tko__parker_unpark(&c.pk);
    pthread_join(t, NULL);
    cr_assert_eq(atomic_load(&c.result), 1, "round %d", r);
    tt_count_fini(&c.ready);
    tko__parker_fini(&c.pk);
  }
}

/* Two threads pass a token back and forth through two parkers; any lost
 * permit stalls the exchange until PARK_LIMIT_NS and fails the test. */
typedef struct pingpong {
  tko__parker a, b;
  long rounds;
  atomic_int failed;
} pingpong;

static void *pong(void *arg) {
  pingpong *p = arg;
  for (long i = 0; i < p->rounds; i++) {
    if (!tko__parker_park(&p->b, PARK_LIMIT_NS)) {
      atomic_store(&p->failed, 1);
      return NULL;
    }
    tko__parker_unpark(&p->a);
  }
  return NULL;
}

Test(signal, ping_pong_loses_no_permit) {
  pingpong p;
  cr_assert_eq(tko__parker_init(&p.a), 0);
  cr_assert_eq(tko__parker_init(&p.b), 0);
  p.rounds = TT_SCALE(100000, 10000);
  atomic_init(&p.failed, 0);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, pong, &p), 0);
  long done = 0;
  for (; done < p.rounds; done++) {
    tko__parker_unpark(&p.b);
    if (!tko__parker_park(&p.a, PARK_LIMIT_NS)) break;
  }
  pthread_join(t, NULL);
  cr_assert_eq(atomic_load(&p.failed), 0);
  cr_assert_eq(done, p.rounds);
  tko__parker_fini(&p.a);
  tko__parker_fini(&p.b);
}

static void sleeper_init(tko__sleeper *s) {
  cr_assert_eq(tko__parker_init(&s->parker), 0);
  s->prev = s->next = NULL;
  s->listed = false;
}

Test(signal, search_counts) {
  tko__idle idle;
  cr_assert_eq(tko__idle_init(&idle), 0);
  cr_assert_eq(state_of(&idle), 0);
  tko__idle_search_begin(&idle);
  tko__idle_search_begin(&idle);
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 2);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  cr_assert_not(tko__idle_search_end(&idle), "one searcher is still looking");
  cr_assert(tko__idle_search_end(&idle), "the last searcher is told so");
  cr_assert_eq(state_of(&idle), 0);
  tko__idle_fini(&idle);
}

Test(signal, wake_one_with_nobody_asleep_does_nothing) {
  tko__idle idle;
  cr_assert_eq(tko__idle_init(&idle), 0);
  cr_assert_not(tko__idle_wake_one(&idle));
  cr_assert_eq(state_of(&idle), 0);
  tko__idle_search_begin(&idle);
  cr_assert_not(tko__idle_wake_one(&idle));
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 1, "searchers are not touched");
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  tko__idle_fini(&idle);
}

Test(signal, sleep_prepare_then_cancel_restores_searching) {
  tko__idle idle;
  tko__sleeper s;
  cr_assert_eq(tko__idle_init(&idle), 0);
  sleeper_init(&s);
  tko__idle_search_begin(&idle);
  tko__idle_sleep_prepare(&idle, &s);
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 0);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 1);
  cr_assert(s.listed);
  cr_assert(tko__idle_sleep_cancel(&idle, &s), "nobody claimed it: cancel wins");
  cr_assert_not(s.listed);
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 1);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  /* No permit was left behind by the cancelled sleep. */
  cr_assert_not(tko__parker_park(&s.parker, 0));
  cr_assert_not(tko__idle_wake_one(&idle), "the list is empty again");
  tko__parker_fini(&s.parker);
  tko__idle_fini(&idle);
}

Test(signal, wake_one_claims_sleeper_and_leaves_permit) {
  tko__idle idle;
  tko__sleeper s;
  cr_assert_eq(tko__idle_init(&idle), 0);
  sleeper_init(&s);
  tko__idle_search_begin(&idle);
  tko__idle_sleep_prepare(&idle, &s);
  cr_assert(tko__idle_wake_one(&idle));
  /* The waker counts the woken worker as searching before it runs. */
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 1);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  cr_assert_not(s.listed);
  /* A cancel that lost the race reports it; the permit is on its way (here
   * already left) and must be consumed. Counts do not change. */
  cr_assert_not(tko__idle_sleep_cancel(&idle, &s));
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 1);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  cr_assert(tko__parker_park(&s.parker, 0));
  cr_assert_not(tko__parker_park(&s.parker, 0), "exactly one permit");
  cr_assert_not(tko__idle_wake_one(&idle));
  tko__parker_fini(&s.parker);
  tko__idle_fini(&idle);
}

Test(signal, wake_one_is_lifo) {
  tko__idle idle;
  tko__sleeper s[3];
  cr_assert_eq(tko__idle_init(&idle), 0);
  for (int i = 0; i < 3; i++) {
    sleeper_init(&s[i]);
    tko__idle_search_begin(&idle);
  }
  for (int i = 0; i < 3; i++) tko__idle_sleep_prepare(&idle, &s[i]);
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 0);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 3);
  /* The most recently idle (s[2]) is woken first, then s[1], then s[0]. */
  for (int k = 2; k >= 0; k--) {
    cr_assert(tko__idle_wake_one(&idle));
    cr_assert_not(s[k].listed);
    cr_assert(tko__parker_park(&s[k].parker, 0));
    for (int j = 0; j < k; j++) {
      cr_assert(s[j].listed, "an older sleeper stays asleep");
      cr_assert_not(tko__parker_park(&s[j].parker, 0));
    }
    cr_assert_eq(tko__idle_searching(state_of(&idle)), (uint32_t)(3 - k));
    cr_assert_eq(tko__idle_sleeping(state_of(&idle)), (uint32_t)k);
  }
  cr_assert_not(tko__idle_wake_one(&idle));
  for (int i = 0; i < 3; i++) tko__parker_fini(&s[i].parker);
  tko__idle_fini(&idle);
}

Test(signal, cancel_from_middle_of_list_keeps_others) {
  tko__idle idle;
  tko__sleeper s[3];
  cr_assert_eq(tko__idle_init(&idle), 0);
  for (int i = 0; i < 3; i++) {
    sleeper_init(&s[i]);
    tko__idle_search_begin(&idle);
    tko__idle_sleep_prepare(&idle, &s[i]);
  }
  cr_assert(tko__idle_sleep_cancel(&idle, &s[1]));
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 1);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 2);
  cr_assert(tko__idle_wake_one(&idle));
  cr_assert(tko__parker_park(&s[2].parker, 0));
  cr_assert(tko__idle_wake_one(&idle));
  cr_assert(tko__parker_park(&s[0].parker, 0));
  cr_assert_not(tko__parker_park(&s[1].parker, 0), "the cancelled one got no permit");
  cr_assert_not(tko__idle_wake_one(&idle));
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 3);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  for (int i = 0; i < 3; i++) tko__parker_fini(&s[i].parker);
  tko__idle_fini(&idle);
}

Test(signal, wake_all_wakes_every_sleeper) {
  tko__idle idle;
  tko__sleeper s[4];
  cr_assert_eq(tko__idle_init(&idle), 0);
  for (int i = 0; i < 4; i++) {
    sleeper_init(&s[i]);
    tko__idle_search_begin(&idle);
    tko__idle_sleep_prepare(&idle, &s[i]);
  }
  tko__idle_wake_all(&idle);
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 4);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  for (int i = 0; i < 4; i++) {
    cr_assert_not(s[i].listed);
    cr_assert(tko__parker_park(&s[i].parker, 0));
  }
  tko__idle_wake_all(&idle); /* nobody left: harmless */
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 4);
  for (int i = 0; i < 4; i++) tko__parker_fini(&s[i].parker);
  tko__idle_fini(&idle);
}

/* The Dekker handshake of signal.c's essay with real threads: a sleeper
 * announces its sleep, re-checks a flag and parks; a waker raises the flag
 * and calls wake_one. Either the sleeper sees the flag or the waker sees
 * the sleeper, every round. A lost wake-up shows as a park timing out. */
typedef struct dekker {
  tko__idle idle;
  tko__sleeper s;
  atomic_int flag;     /* the "work" the waker publishes */
  tt_count round_done; /* rounds the sleeper finished */
  tt_count round_go;   /* rounds the waker allowed to start */
  long rounds;
  atomic_int lost;
} dekker;

static void *dekker_sleeper(void *arg) {
  dekker *d = arg;
  for (long r = 0; r < d->rounds; r++) {
    if (!tt_count_wait_geq(&d->round_go, r + 1)) {
      atomic_store(&d->lost, 1);
      return NULL;
    }
    tko__idle_search_begin(&d->idle);
    for (;;) {
      if (atomic_exchange(&d->flag, 0)) break; /* consume the work */
      tko__idle_sleep_prepare(&d->idle, &d->s);
      if (atomic_load(&d->flag)) { /* the re-check, after the announcement */
        /* Claimed by the waker: its permit must arrive. */
        if (!tko__idle_sleep_cancel(&d->idle, &d->s) &&
            !tko__parker_park(&d->s.parker, PARK_LIMIT_NS)) {
          atomic_store(&d->lost, 1);
          return NULL;
        }
        continue;
      }
      if (!tko__parker_park(&d->s.parker, PARK_LIMIT_NS)) {
        atomic_store(&d->lost, 1);
        return NULL;
      }
    }
    tko__idle_search_end(&d->idle);
    tt_count_add(&d->round_done, 1);
  }
  return NULL;
}

Test(signal, dekker_handshake_never_loses_a_wakeup) {
  dekker *d = calloc(1, sizeof *d);
  cr_assert_not_null(d);
  cr_assert_eq(tko__idle_init(&d->idle), 0);
  sleeper_init(&d->s);
  tt_count_init(&d->round_done);
  tt_count_init(&d->round_go);
  d->rounds = TT_SCALE(50000, 5000);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, dekker_sleeper, d), 0);
  for (long r = 0; r < d->rounds && !atomic_load(&d->lost); r++) {
    tt_count_add(&d->round_go, 1);
    atomic_store(&d->flag, 1);
    tko__idle_wake_one(&d->idle);
    if (!tt_count_wait_geq(&d->round_done, r + 1)) break;
  }
  pthread_join(t, NULL);
  cr_assert_eq(atomic_load(&d->lost), 0, "a wake-up was lost");
  cr_assert_eq(tt_count_get(&d->round_done), d->rounds);
  cr_assert_eq(state_of(&d->idle), 0, "counts balanced after every round");
  tt_count_fini(&d->round_done);
  tt_count_fini(&d->round_go);
  tko__parker_fini(&d->s.parker);
  tko__idle_fini(&d->idle);
  free(d);
}
