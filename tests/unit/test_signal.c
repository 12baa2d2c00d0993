/* SPDX-License-Identifier: MIT */
/* Unit tests for the sleep/wake signal (src/structures/signal.h): the parker's permit
 * semantics within a thread and across threads, and the idle word's
 * searching/sleeping counts and the idle set through search, sleep_prepare,
 * sleep, sleep_cancel, wake_one and wake_all: wakers racing each other
 * claim each sleeper once, a waker that loses its bit to a cancel claims
 * another (seam tko__test_wake_window), a cancel racing a waker settles
 * once, and the Dekker handshake never loses a wake-up. */
#include <pthread.h>
#include <sched.h>
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

/* An idle set over n sleepers of an array (bits 0 to n - 1). */
static void set_init(tko__idle *idle, tko__sleeper *s, unsigned n) {
  for (unsigned i = 0; i < n; i++) cr_assert_eq(tko__sleeper_init(&s[i], i), 0);
  tko__idle_init(idle, s, sizeof *s, n);
}

static void set_fini(tko__sleeper *s, unsigned n) {
  for (unsigned i = 0; i < n; i++) tko__sleeper_fini(&s[i]);
}

/* Whether sleeper i is in the set, asleep and unclaimed. */
static bool in_set(tko__idle *idle, unsigned i) {
  return (atomic_load(&idle->asleep[i / 64]) >> (i % 64)) & 1;
}

Test(signal, search_counts) {
  tko__idle idle;
  tko__idle_init(&idle, NULL, 0, 0);
  cr_assert_eq(state_of(&idle), 0);
  tko__idle_search_begin(&idle);
  tko__idle_search_begin(&idle);
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 2);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  cr_assert_not(tko__idle_search_end(&idle), "one searcher is still looking");
  cr_assert(tko__idle_search_end(&idle), "the last searcher is told so");
  cr_assert_eq(state_of(&idle), 0);
}

Test(signal, wake_one_with_nobody_asleep_does_nothing) {
  tko__idle idle;
  tko__sleeper s[2];
  set_init(&idle, s, 2);
  cr_assert_not(tko__idle_wake_one(&idle));
  cr_assert_eq(state_of(&idle), 0);
  tko__idle_search_begin(&idle);
  cr_assert_not(tko__idle_wake_one(&idle));
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 1, "searchers are not touched");
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  set_fini(s, 2);
}

Test(signal, sleep_prepare_then_cancel_restores_searching) {
  tko__idle idle;
  tko__sleeper s[1];
  set_init(&idle, s, 1);
  tko__idle_search_begin(&idle);
  tko__idle_sleep_prepare(&idle, &s[0]);
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 0);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 1);
  cr_assert(in_set(&idle, 0));
  cr_assert(tko__idle_sleep_cancel(&idle, &s[0]), "nobody claimed it: cancel wins");
  cr_assert_not(in_set(&idle, 0));
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 1);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  /* No permit was left behind by the cancelled sleep. */
  cr_assert_not(tko__parker_park(&s[0].parker, 0));
  cr_assert_not(tko__idle_wake_one(&idle), "the set is empty again");
  /* A sleep that times out is still in the set until it cancels. */
  tko__idle_sleep_prepare(&idle, &s[0]);
  cr_assert_not(tko__idle_sleep(&idle, &s[0], 1000000)); /* 1 ms */
  cr_assert(in_set(&idle, 0));
  cr_assert(tko__idle_sleep_cancel(&idle, &s[0]));
  cr_assert_eq(state_of(&idle), TKO__SEARCHING_ONE);
  set_fini(s, 1);
}

Test(signal, wake_one_claims_sleeper_and_leaves_permit) {
  tko__idle idle;
  tko__sleeper s[1];
  set_init(&idle, s, 1);
  tko__idle_search_begin(&idle);
  tko__idle_sleep_prepare(&idle, &s[0]);
  cr_assert(tko__idle_wake_one(&idle));
  /* The waker counts the woken worker as searching before it runs. */
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 1);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  cr_assert_not(in_set(&idle, 0));
  /* A cancel that lost the race reports it and consumes the permit (here
   * already left). Counts do not change. */
  cr_assert_not(tko__idle_sleep_cancel(&idle, &s[0]));
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 1);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  cr_assert_not(tko__parker_park(&s[0].parker, 0), "exactly one permit, consumed");
  cr_assert_not(tko__idle_wake_one(&idle));
  /* The same through a sleep: the permit ends it, counted once. */
  tko__idle_sleep_prepare(&idle, &s[0]);
  cr_assert(tko__idle_wake_one(&idle));
  cr_assert(tko__idle_sleep(&idle, &s[0], 0));
  cr_assert_eq(state_of(&idle), TKO__SEARCHING_ONE);
  cr_assert_not(tko__parker_park(&s[0].parker, 0));
  set_fini(s, 1);
}

/* The lowest bit first (basic workers before elastic ones), across words. */
Test(signal, wake_one_takes_the_lowest_bit) {
  enum { N = 130 };
  static tko__sleeper s[N];
  static const unsigned order[] = {129, 3, 64};
  static const unsigned woken[] = {3, 64, 129};
  tko__idle idle;
  set_init(&idle, s, N);
  for (int i = 0; i < 3; i++) {
    tko__idle_search_begin(&idle);
    tko__idle_sleep_prepare(&idle, &s[order[i]]);
  }
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 0);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 3);
  for (int k = 0; k < 3; k++) {
    cr_assert(tko__idle_wake_one(&idle));
    cr_assert_not(in_set(&idle, woken[k]));
    cr_assert(tko__parker_park(&s[woken[k]].parker, 0));
    for (int j = k + 1; j < 3; j++) {
      cr_assert(in_set(&idle, woken[j]), "a higher sleeper stays asleep");
      cr_assert_not(tko__parker_park(&s[woken[j]].parker, 0));
    }
    cr_assert_eq(tko__idle_searching(state_of(&idle)), (uint32_t)(k + 1));
    cr_assert_eq(tko__idle_sleeping(state_of(&idle)), (uint32_t)(2 - k));
  }
  cr_assert_not(tko__idle_wake_one(&idle));
  set_fini(s, N);
}

Test(signal, cancel_from_the_middle_keeps_others) {
  tko__idle idle;
  tko__sleeper s[3];
  set_init(&idle, s, 3);
  for (int i = 0; i < 3; i++) {
    tko__idle_search_begin(&idle);
    tko__idle_sleep_prepare(&idle, &s[i]);
  }
  cr_assert(tko__idle_sleep_cancel(&idle, &s[1]));
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 1);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 2);
  cr_assert(tko__idle_wake_one(&idle));
  cr_assert(tko__parker_park(&s[0].parker, 0));
  cr_assert(tko__idle_wake_one(&idle));
  cr_assert(tko__parker_park(&s[2].parker, 0));
  cr_assert_not(tko__parker_park(&s[1].parker, 0), "the cancelled one got no permit");
  cr_assert_not(tko__idle_wake_one(&idle));
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 3);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  set_fini(s, 3);
}

Test(signal, wake_all_wakes_every_sleeper) {
  enum { N = 200 };
  static tko__sleeper s[N];
  static const unsigned asleep[] = {0, 63, 64, 127, 150, 199};
  tko__idle idle;
  set_init(&idle, s, N);
  for (int i = 0; i < 6; i++) {
    tko__idle_search_begin(&idle);
    tko__idle_sleep_prepare(&idle, &s[asleep[i]]);
  }
  tko__idle_wake_all(&idle);
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 6);
  cr_assert_eq(tko__idle_sleeping(state_of(&idle)), 0);
  for (int i = 0; i < 6; i++) {
    cr_assert_not(in_set(&idle, asleep[i]));
    cr_assert(tko__parker_park(&s[asleep[i]].parker, 0));
  }
  cr_assert_not(tko__parker_park(&s[1].parker, 0), "nobody else got a permit");
  tko__idle_wake_all(&idle); /* nobody left: harmless */
  cr_assert_eq(tko__idle_searching(state_of(&idle)), 6);
  set_fini(s, N);
}

/* Wakers racing each other claim every sleeper exactly once: with as many
 * wake_one calls as sleepers, every call claims one (a waker that loses
 * the race for a bit looks at the others again), each sleeper holds one
 * permit, and the counts balance. */
enum { CLAIM_SLEEPERS = 64, CLAIM_WAKERS = 2 };

typedef struct claim_race {
  tko__idle idle;
  tko__sleeper s[CLAIM_SLEEPERS];
  atomic_long go; /* the round the wakers may start: they spin on it, so
                     that they start together and race for the same bits */
  tt_count done;
  atomic_int wins;
  atomic_bool stop;
} claim_race;

static void *claim_waker(void *arg) {
  claim_race *c = arg;
  for (long r = 1;; r++) {
    for (unsigned spins = 0; atomic_load(&c->go) < r; spins++)
      if (spins % 1024 == 1023) sched_yield(); /* a machine with fewer cores */
    if (atomic_load(&c->stop)) return NULL;
    for (int i = 0; i < CLAIM_SLEEPERS / CLAIM_WAKERS; i++)
      if (tko__idle_wake_one(&c->idle)) atomic_fetch_add(&c->wins, 1);
    tt_count_add(&c->done, 1);
  }
}

Test(signal, racing_wakers_claim_each_sleeper_exactly_once) {
  claim_race *c = calloc(1, sizeof *c);
  cr_assert_not_null(c);
  set_init(&c->idle, c->s, CLAIM_SLEEPERS);
  tt_count_init(&c->done);
  pthread_t t[CLAIM_WAKERS];
  for (int i = 0; i < CLAIM_WAKERS; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, claim_waker, c), 0);
  const long rounds = TT_SCALE(500, 50);
  for (long r = 1; r <= rounds; r++) {
    for (int i = 0; i < CLAIM_SLEEPERS; i++) {
      tko__idle_search_begin(&c->idle);
      tko__idle_sleep_prepare(&c->idle, &c->s[i]);
    }
    atomic_store(&c->wins, 0);
    atomic_store(&c->go, r);
    cr_assert(tt_count_wait_geq(&c->done, r * CLAIM_WAKERS));
    cr_assert_eq(atomic_load(&c->wins), CLAIM_SLEEPERS, "round %ld: a call claimed nobody", r);
    cr_assert_not(tko__idle_wake_one(&c->idle), "round %ld: a sleeper claimed twice", r);
    cr_assert_eq(state_of(&c->idle), CLAIM_SLEEPERS * TKO__SEARCHING_ONE, "round %ld", r);
    for (int i = 0; i < CLAIM_SLEEPERS; i++) {
      cr_assert(tko__parker_park(&c->s[i].parker, 0), "round %ld: %d woken", r, i);
      cr_assert_not(tko__parker_park(&c->s[i].parker, 0), "round %ld: %d woken once", r, i);
      tko__idle_search_end(&c->idle);
    }
  }
  atomic_store(&c->stop, true);
  atomic_store(&c->go, rounds + 1); /* the wakers see stop and leave */
  for (int i = 0; i < CLAIM_WAKERS; i++) pthread_join(t[i], NULL);
  set_fini(c->s, CLAIM_SLEEPERS);
  tt_count_fini(&c->done);
  free(c);
}

/* A waker that read a word and finds its bit gone when it claims (the
 * sleeper cancelled meanwhile, and another went to sleep) looks at the
 * word again and claims the other: no wake-up is lost to the race. The
 * seam parks the waker between its read and its claim. */
typedef struct scan_race {
  tko__idle idle;
  tko__sleeper s[2];
  tt_count scanned;
  tt_gate go_on;
  atomic_bool parked_once;
  bool woke;
} scan_race;

static scan_race *scan_cur;

static void park_after_the_scan(enum tko__wake_point at) {
  if (at != TKO__WAKE_SCANNED || atomic_exchange(&scan_cur->parked_once, true)) return;
  tt_count_add(&scan_cur->scanned, 1);
  tt_gate_wait(&scan_cur->go_on);
}

static void *scan_waker(void *arg) {
  scan_race *c = arg;
  c->woke = tko__idle_wake_one(&c->idle);
  return NULL;
}

Test(signal, a_waker_whose_bit_was_taken_claims_another) {
  scan_race *c = calloc(1, sizeof *c);
  cr_assert_not_null(c);
  set_init(&c->idle, c->s, 2);
  tt_count_init(&c->scanned);
  c->go_on = (tt_gate)TT_GATE_INIT;
  scan_cur = c;
  tko__idle_search_begin(&c->idle);
  tko__idle_search_begin(&c->idle);
  tko__idle_sleep_prepare(&c->idle, &c->s[0]);
  atomic_store(&tko__test_wake_window, park_after_the_scan);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, scan_waker, c), 0);
  cr_assert(tt_count_wait_geq(&c->scanned, 1)); /* it read bit 0 set */
  cr_assert(tko__idle_sleep_cancel(&c->idle, &c->s[0]), "the waker has not claimed it yet");
  tko__idle_sleep_prepare(&c->idle, &c->s[1]);
  tt_gate_open(&c->go_on);
  pthread_join(t, NULL);
  atomic_store(&tko__test_wake_window, NULL);
  cr_assert(c->woke, "the waker gave up after losing bit 0; sleeper 1 sleeps on");
  cr_assert(tko__parker_park(&c->s[1].parker, 0));
  cr_assert_not(tko__parker_park(&c->s[0].parker, 0));
  cr_assert_eq(state_of(&c->idle), 2 * TKO__SEARCHING_ONE);
  scan_cur = NULL;
  tt_count_fini(&c->scanned);
  set_fini(c->s, 2);
  free(c);
}

/* A sleeper's cancel racing a waker: exactly one of them takes the bit;
 * the cancel that lost consumes the waker's permit; no permit is left and
 * the counts balance, every round. */
typedef struct cancel_race {
  tko__idle idle;
  tko__sleeper s[1];
  tt_count go, done;
  long rounds;
  atomic_int woke; /* this round's wake_one result */
} cancel_race;

static void *cancel_waker(void *arg) {
  cancel_race *c = arg;
  for (long r = 1; r <= c->rounds; r++) {
    if (!tt_count_wait_geq(&c->go, r)) return NULL;
    atomic_store(&c->woke, tko__idle_wake_one(&c->idle));
    tt_count_add(&c->done, 1);
  }
  return NULL;
}

Test(signal, a_cancel_racing_a_waker_settles_once) {
  cancel_race *c = calloc(1, sizeof *c);
  cr_assert_not_null(c);
  set_init(&c->idle, c->s, 1);
  tt_count_init(&c->go);
  tt_count_init(&c->done);
  c->rounds = TT_SCALE(20000, 2000);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, cancel_waker, c), 0);
  for (long r = 1; r <= c->rounds; r++) {
    tko__idle_search_begin(&c->idle);
    tko__idle_sleep_prepare(&c->idle, &c->s[0]);
    tt_count_add(&c->go, 1);
    bool own = tko__idle_sleep_cancel(&c->idle, &c->s[0]);
    cr_assert(tt_count_wait_geq(&c->done, r));
    cr_assert_neq(own, atomic_load(&c->woke), "round %ld: one of them takes the bit", r);
    cr_assert_eq(state_of(&c->idle), TKO__SEARCHING_ONE, "round %ld", r);
    cr_assert_not(tko__parker_park(&c->s[0].parker, 0), "round %ld: a stray permit", r);
    tko__idle_search_end(&c->idle);
  }
  pthread_join(t, NULL);
  set_fini(c->s, 1);
  tt_count_fini(&c->go);
  tt_count_fini(&c->done);
  free(c);
}

/* The Dekker handshake of signal.c's essay with real threads: a sleeper
 * announces its sleep, re-checks a flag and parks; a waker raises the flag
 * and calls wake_one. Either the sleeper sees the flag or the waker sees
 * the sleeper, every round. A lost wake-up shows as a sleep timing out. */
typedef struct dekker {
  tko__idle idle;
  tko__sleeper s[1];
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
      tko__idle_sleep_prepare(&d->idle, &d->s[0]);
      if (atomic_load(&d->flag)) { /* the re-check, after the announcement */
        /* Claimed by the waker or not, it ends searching. */
        tko__idle_sleep_cancel(&d->idle, &d->s[0]);
        continue;
      }
      if (!tko__idle_sleep(&d->idle, &d->s[0], PARK_LIMIT_NS)) {
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
  set_init(&d->idle, d->s, 1);
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
  set_fini(d->s, 1);
  free(d);
}
