/* SPDX-License-Identifier: MIT */
/* The completion queue (taskorch/completion.h): exactly-once delivery under
 * concurrent posts, the descriptor's readability, a full ring, destroy.
 * The executable test_completion_pipe links this file again beside
 * tests/unit/test_completion_pipe.c, which turns on the pipe fallback. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <taskorch.h>
#include <unistd.h>

#include "tko_test.h"
#include "tko_test_fault.h"
#include "tko_test_sync.h"

/* Whether the queue's descriptor is readable now (no waiting). */
static bool readable(tko_cq *cq) {
  struct pollfd p = {.fd = tko_cq_fd(cq), .events = POLLIN};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

/* Waits for the descriptor as a loop would; false if TT_LONG_MS passed
 * (a lost wake-up). */
static bool wait_readable(tko_cq *cq) {
  struct pollfd p = {.fd = tko_cq_fd(cq), .events = POLLIN};
  return poll(&p, 1, (int)TT_LONG_MS) == 1;
}

/* Memory comes from the given allocator, all of it back at destroy. */
static long live_blocks;
static void *count_alloc(void *ctx, size_t size) {
  (void)ctx;
  live_blocks++;
  return malloc(size);
}
static void *count_realloc(void *ctx, void *p, size_t size) {
  (void)ctx;
  return realloc(p, size);
}
static void count_free(void *ctx, void *p) {
  (void)ctx;
  if (p) live_blocks--;
  free(p);
}

static tko_cq *make_cq(size_t capacity) {
  tko_cq *cq = NULL;
  cr_assert_eq(tko_cq_create(&cq, capacity, NULL), 0);
  cr_assert_not_null(cq);
  return cq;
}

Test(completion, bad_arguments) {
  tko_cq *cq = NULL;
  tko_completion c;
  cr_assert_eq(tko_cq_create(NULL, 4, NULL), -EINVAL);
  cr_assert_eq(tko_cq_create(&cq, TKO_MAX_CQ_CAPACITY + 1, NULL), -EINVAL);
  cr_assert_null(cq);
  tko_allocator half = {.free = count_free}; /* one of three: partial */
  cr_assert_eq(tko_cq_create(&cq, 4, &half), -EINVAL);
  cr_assert_eq(tko_cq_fd(NULL), -EINVAL);
  cr_assert_eq(tko_cq_post(NULL, 1, 0, NULL), -EINVAL);
  cr_assert_eq(tko_cq_drain(NULL, NULL, NULL, 0), -EINVAL);
  cr_assert_eq(tko_cq_take(NULL, &c, 1), -EINVAL);
  cr_assert_eq(tko_cq_destroy(NULL), -EINVAL);
  cq = make_cq(4);
  cr_assert_eq(tko_cq_drain(cq, NULL, NULL, 0), -EINVAL);
  cr_assert_eq(tko_cq_take(cq, NULL, 1), -EINVAL);
  cr_assert_eq(tko_cq_take(cq, &c, 0), -EINVAL);
  cr_assert_geq(tko_cq_fd(cq), 0);
  cr_assert_eq(tko_cq_destroy(cq), 0);
}

/* Fills a ring of `capacity` (rounded up to `slots`) and checks the limit:
 * -EAGAIN queues nothing, one take makes room for exactly one more, and
 * the completions come out in post order, the rejected one never. */
static void check_full_ring(size_t capacity, size_t slots) {
  tko_cq *cq = make_cq(capacity);
  for (size_t i = 0; i < slots; i++) cr_assert_eq(tko_cq_post(cq, i, (int)i, NULL), 0);
  cr_assert_eq(tko_cq_post(cq, 999, 0, NULL), -EAGAIN);
  cr_assert_eq(tko_cq_destroy(cq), -EBUSY); /* still queued: nothing freed */
  tko_completion c[64];
  cr_assert_eq(tko_cq_take(cq, c, 1), 1);
  cr_assert_eq(c[0].id, 0);
  cr_assert_eq(tko_cq_post(cq, slots, (int)slots, NULL), 0);
  cr_assert_eq(tko_cq_post(cq, 999, 0, NULL), -EAGAIN);
  cr_assert_eq(tko_cq_take(cq, c, 64), (long)slots);
  for (size_t i = 0; i < slots; i++) {
    cr_assert_eq(c[i].id, i + 1);
    cr_assert_eq(c[i].status, (int)(i + 1));
  }
  cr_assert_eq(tko_cq_take(cq, c, 64), 0);
  cr_assert_eq(tko_cq_destroy(cq), 0);
}

Test(completion, full_ring_rejects_and_keeps_order) {
  check_full_ring(4, 4);
  check_full_ring(3, 4); /* rounded up to a power of two */
  check_full_ring(2, 2);
}

/* 1 is a power of two: a queue of capacity 1 holds one completion, not
 * two, and laps its single slot. */
Test(completion, capacity_one_holds_exactly_one) {
  check_full_ring(1, 1);
  tko_cq *cq = make_cq(1);
  tko_completion c;
  for (uint64_t i = 0; i < 10; i++) {
    cr_assert_eq(tko_cq_post(cq, i, 0, NULL), 0);
    cr_assert_eq(tko_cq_post(cq, 100 + i, 0, NULL), -EAGAIN, "capacity 1 took a second");
    cr_assert_eq(tko_cq_take(cq, &c, 1), 1);
    cr_assert_eq(c.id, i);
  }
  cr_assert_eq(tko_cq_take(cq, &c, 1), 0);
  cr_assert_eq(tko_cq_destroy(cq), 0);
}

/* Laps the ring many times: every slot is reused with its sequence. */
Test(completion, wraps_around) {
  tko_cq *cq = make_cq(4);
  tko_completion c[3];
  uint64_t next = 0, expect = 0;
  for (int round = 0; round < 100; round++) {
    for (int i = 0; i < 3; i++) cr_assert_eq(tko_cq_post(cq, next++, 0, &next), 0);
    cr_assert_eq(tko_cq_take(cq, c, 3), 3);
    for (int i = 0; i < 3; i++) {
      cr_assert_eq(c[i].id, expect++);
      cr_assert_eq(c[i].user, &next);
    }
  }
  cr_assert_eq(tko_cq_destroy(cq), 0);
}

Test(completion, descriptor_readable_exactly_while_completions_wait) {
  tko_cq *cq = make_cq(8);
  tko_completion c[8];
  cr_assert_not(readable(cq)); /* fresh: nothing to take */
  cr_assert_eq(tko_cq_post(cq, 1, 0, NULL), 0);
  cr_assert(readable(cq));
  cr_assert_eq(tko_cq_post(cq, 2, 0, NULL), 0);
  cr_assert(readable(cq)); /* still; one signal per burst */
  cr_assert_eq(tko_cq_take(cq, c, 8), 2);
  cr_assert_not(readable(cq)); /* drained, nothing posted since */
  cr_assert_eq(tko_cq_take(cq, c, 8), 0);
  /* After a drain the next post signals again. */
  cr_assert_eq(tko_cq_post(cq, 3, 0, NULL), 0);
  cr_assert(readable(cq));
  /* A drain that stops at its limit leaves the descriptor readable. */
  cr_assert_eq(tko_cq_post(cq, 4, 0, NULL), 0);
  cr_assert_eq(tko_cq_take(cq, c, 1), 1);
  cr_assert_eq(c[0].id, 3);
  cr_assert(readable(cq));
  cr_assert_eq(tko_cq_take(cq, c, 1), 1);
  cr_assert_eq(c[0].id, 4);
  cr_assert(readable(cq)); /* stopped at its limit: maybe more, so readable */
  cr_assert_eq(tko_cq_take(cq, c, 1), 0);
  cr_assert_not(readable(cq));
  cr_assert_eq(tko_cq_destroy(cq), 0);
}

/* A poster stopped between reserving its slot and publishing it is
 * tests/unit/test_completion_window.c's: a test seam parks it there. */

/* What drain's callback records: every id seen, in order. */
typedef struct seen {
  tko_cq *cq;
  uint64_t ids[64];
  size_t n;
  size_t reposts; /* the callback posts each completion once more */
} seen;

static void record(void *user, const tko_completion *c) {
  seen *s = user;
  if (s->n < 64) s->ids[s->n] = c->id;
  s->n++;
  if (s->reposts && c->id < 1000) {
    s->reposts--;
    cr_assert_eq(tko_cq_post(s->cq, c->id + 1000, 0, NULL), 0);
  }
}

Test(completion, drain_calls_back_in_order_and_is_bounded) {
  tko_cq *cq = make_cq(8);
  seen s = {.cq = cq};
  for (uint64_t i = 0; i < 5; i++) cr_assert_eq(tko_cq_post(cq, i, 0, NULL), 0);
  cr_assert_eq(tko_cq_drain(cq, record, &s, 2), 2); /* max */
  cr_assert(readable(cq));
  cr_assert_eq(tko_cq_drain(cq, record, &s, 0), 3);
  cr_assert_eq(s.n, 5);
  for (uint64_t i = 0; i < 5; i++) cr_assert_eq(s.ids[i], i);
  /* A callback that posts again does not keep the drain going forever:
   * max 0 means one ring's worth; the rest waits, the descriptor says so. */
  s.n = 0;
  s.reposts = 8;
  for (uint64_t i = 0; i < 8; i++) cr_assert_eq(tko_cq_post(cq, i, 0, NULL), 0);
  cr_assert_eq(tko_cq_drain(cq, record, &s, 0), 8);
  cr_assert(readable(cq));
  cr_assert_eq(tko_cq_drain(cq, record, &s, 0), 8);
  for (size_t i = 8; i < 16; i++) cr_assert_eq(s.ids[i], 1000 + (i - 8));
  cr_assert_eq(tko_cq_destroy(cq), 0);
}

/* A completion posted from a drain's callback waits for the next drain,
 * even when the drain's max would have room for it: the drain delivers
 * what was queued when it began. The descriptor says the new one waits. */
typedef struct repost {
  tko_cq *cq;
  uint64_t ids[8];
  size_t n;
} repost;

static void post_again(void *user, const tko_completion *c) {
  repost *r = user;
  cr_assert_lt(r->n, 8);
  r->ids[r->n++] = c->id;
  if (c->id < 100) cr_assert_eq(tko_cq_post(r->cq, c->id + 100, 0, NULL), 0);
}

Test(completion, a_completion_posted_by_the_callback_waits_for_the_next_drain) {
  tko_cq *cq = make_cq(8);
  repost r = {.cq = cq};
  cr_assert_eq(tko_cq_post(cq, 1, 0, NULL), 0);
  cr_assert_eq(tko_cq_drain(cq, post_again, &r, 0), 1, "the drain delivered its own callback's post");
  cr_assert_eq(r.n, 1);
  cr_assert_eq(r.ids[0], 1);
  cr_assert(readable(cq)); /* the callback's completion waits, and says so */
  cr_assert_eq(tko_cq_drain(cq, post_again, &r, 5), 1);
  cr_assert_eq(r.ids[1], 101);
  cr_assert_not(readable(cq));
  /* Two queued, each reposting: two now, their two next time. */
  cr_assert_eq(tko_cq_post(cq, 2, 0, NULL), 0);
  cr_assert_eq(tko_cq_post(cq, 3, 0, NULL), 0);
  cr_assert_eq(tko_cq_drain(cq, post_again, &r, 8), 2);
  cr_assert(readable(cq));
  cr_assert_eq(tko_cq_drain(cq, post_again, &r, 8), 2);
  cr_assert_eq(r.n, 6);
  uint64_t want[6] = {1, 101, 2, 3, 102, 103};
  for (size_t i = 0; i < 6; i++) cr_assert_eq(r.ids[i], want[i]);
  cr_assert_eq(tko_cq_destroy(cq), 0);
}

/* Many threads post at once into a small ring (so it laps and fills), one
 * loop thread waits on the descriptor and drains: every completion arrives
 * exactly once, each poster's in its post order, and the loop is never left
 * waiting on a quiet descriptor (that would time out in wait_readable). */
#define POSTERS 4
typedef struct poster {
  tko_cq *cq;
  uint32_t index;
  uint32_t count;
  uint64_t full; /* -EAGAIN answers seen */
} poster;

static void *post_all(void *arg) {
  poster *p = arg;
  for (uint32_t i = 0; i < p->count; i++) {
    uint64_t id = (uint64_t)p->index << 32 | i;
    int rc;
    while ((rc = tko_cq_post(p->cq, id, (int)p->index, p)) == -EAGAIN) {
      p->full++;
      sched_yield(); /* the loop thread needs the core to make room */
    }
    cr_assert_eq(rc, 0);
  }
  return NULL;
}

typedef struct loop_state {
  uint32_t next[POSTERS]; /* next index expected from each poster */
  uint64_t total;
  poster *posters;
} loop_state;

static void check_one(void *user, const tko_completion *c) {
  loop_state *l = user;
  uint32_t who = (uint32_t)(c->id >> 32), i = (uint32_t)c->id;
  cr_assert_lt(who, POSTERS);
  cr_assert_eq(i, l->next[who]); /* exactly once, in this poster's order */
  cr_assert_eq(c->status, (int)who);
  cr_assert_eq(c->user, &l->posters[who]);
  l->next[who]++;
  l->total++;
}

static void run_posters(tko_cq *cq, uint32_t per_poster, bool use_take) {
  poster ps[POSTERS];
  pthread_t t[POSTERS];
  loop_state l = {.posters = ps};
  for (uint32_t i = 0; i < POSTERS; i++) {
    ps[i] = (poster){.cq = cq, .index = i, .count = per_poster};
    cr_assert_eq(pthread_create(&t[i], NULL, post_all, &ps[i]), 0);
  }
  uint64_t want = (uint64_t)POSTERS * per_poster;
  while (l.total < want) {
    cr_assert(wait_readable(cq));
    if (!use_take) {
      cr_assert_geq(tko_cq_drain(cq, check_one, &l, 0), 0);
      continue;
    }
    tko_completion c[5];
    long n = tko_cq_take(cq, c, 5);
    cr_assert_geq(n, 0);
    for (long k = 0; k < n; k++) check_one(&l, &c[k]);
  }
  for (int i = 0; i < POSTERS; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < POSTERS; i++) cr_assert_eq(l.next[i], per_poster);
  tko_completion c;
  cr_assert_eq(tko_cq_take(cq, &c, 1), 0);
  cr_assert_eq(tko_cq_destroy(cq), 0);
}

Test(completion, concurrent_posts_delivered_exactly_once) {
  uint32_t n = TT_SCALE(50000, 5000);
  run_posters(make_cq(16), n, false);
  run_posters(make_cq(4), n, true);      /* tiny ring: full most of the time */
  run_posters(make_cq(0), n / 10, true); /* default capacity */
}

/* Two threads drain at once while posters post: each completion still goes
 * to exactly one of them. */
typedef struct drainer {
  tko_cq *cq;
  atomic_uint_fast64_t *taken;
  uint64_t want;
  uint8_t *seen; /* one byte per id, written by whoever took it */
} drainer;

static void *drain_until(void *arg) {
  drainer *d = arg;
  tko_completion c[7];
  while (atomic_load(d->taken) < d->want) {
    long n = tko_cq_take(d->cq, c, 7);
    for (long k = 0; k < n; k++) {
      uint64_t id = (c[k].id >> 32) * (d->want / POSTERS) + (uint32_t)c[k].id;
      cr_assert_eq(d->seen[id], 0);
      d->seen[id] = 1;
    }
    atomic_fetch_add(d->taken, (uint_fast64_t)n);
    if (n == 0) sched_yield();
  }
  return NULL;
}

Test(completion, concurrent_drainers_share_without_duplicates) {
  uint32_t per = TT_SCALE(20000, 2000);
  tko_cq *cq = make_cq(8);
  uint64_t want = (uint64_t)POSTERS * per;
  uint8_t *seen = calloc(want, 1);
  cr_assert_not_null(seen);
  atomic_uint_fast64_t taken = 0;
  drainer d = {.cq = cq, .taken = &taken, .want = want, .seen = seen};
  poster ps[POSTERS];
  pthread_t t[POSTERS], dt[2];
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&dt[i], NULL, drain_until, &d), 0);
  for (uint32_t i = 0; i < POSTERS; i++) {
    ps[i] = (poster){.cq = cq, .index = i, .count = per};
    cr_assert_eq(pthread_create(&t[i], NULL, post_all, &ps[i]), 0);
  }
  for (int i = 0; i < POSTERS; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 2; i++) pthread_join(dt[i], NULL);
  cr_assert_eq(atomic_load(&taken), want);
  for (uint64_t i = 0; i < want; i++) cr_assert_eq(seen[i], 1);
  free(seen);
  cr_assert_eq(tko_cq_destroy(cq), 0);
}

/* Two drains start together on one queued completion, round after round
 * (one drains, the other takes): exactly one of them delivers it each
 * round - never both, never neither. */
typedef struct racer {
  tko_cq *cq;
  atomic_long *go;        /* the round the racers may start */
  atomic_long *done;      /* racers finished, over all rounds */
  atomic_long *delivered; /* deliveries this round */
  long rounds;
  bool use_take;
} racer;

static void count_delivery(void *user, const tko_completion *c) {
  racer *r = user;
  (void)c;
  atomic_fetch_add(r->delivered, 1);
}

static void *race_rounds(void *arg) {
  racer *r = arg;
  for (long round = 1; round <= r->rounds; round++) {
    while (atomic_load(r->go) < round) sched_yield();
    if (r->use_take) {
      tko_completion c[2];
      long n = tko_cq_take(r->cq, c, 2);
      cr_assert_geq(n, 0);
      if (n) cr_assert_eq(c[0].id, (uint64_t)round);
      atomic_fetch_add(r->delivered, n);
    } else {
      cr_assert_geq(tko_cq_drain(r->cq, count_delivery, r, 0), 0);
    }
    atomic_fetch_add(r->done, 1);
  }
  return NULL;
}

Test(completion, two_drains_racing_for_one_completion_deliver_it_once) {
  long rounds = TT_SCALE(20000, 2000);
  tko_cq *cq = make_cq(4);
  atomic_long go = 0, done = 0, delivered = 0;
  racer rs[2];
  pthread_t t[2];
  for (int i = 0; i < 2; i++) {
    rs[i] = (racer){.cq = cq, .go = &go, .done = &done, .delivered = &delivered,
                    .rounds = rounds, .use_take = i == 1};
    cr_assert_eq(pthread_create(&t[i], NULL, race_rounds, &rs[i]), 0);
  }
  for (long round = 1; round <= rounds; round++) {
    cr_assert_eq(tko_cq_post(cq, (uint64_t)round, 0, NULL), 0);
    atomic_store(&go, round);
    while (atomic_load(&done) < 2 * round) sched_yield();
    long n = atomic_exchange(&delivered, 0);
    cr_assert_eq(n, 1, "round %ld: the completion was delivered %ld times", round, n);
  }
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  cr_assert_eq(tko_cq_destroy(cq), 0);
}

/* The intended use: a pool's after_run hook posts each task's id, status
 * and argument; the host's loop drains them on its own thread. */
static void post_after_run(void *user, const tko_task_info *task) {
  int rc;
  while ((rc = tko_cq_post(user, task->id, task->status, task->arg)) == -EAGAIN) sched_yield();
  cr_assert_eq(rc, 0);
}

static int odd_fails(void *arg) { return (int)((uintptr_t)arg & 1); }

typedef struct task_seen {
  uint64_t *count_by_arg;
  uint64_t total, failed;
} task_seen;

static void count_task(void *user, const tko_completion *c) {
  task_seen *s = user;
  uintptr_t arg = (uintptr_t)c->user;
  cr_assert_eq(c->status, (int)(arg & 1));
  cr_assert_neq(c->id, 0);
  s->count_by_arg[arg]++;
  s->total++;
  s->failed += (uint64_t)c->status;
}

Test(completion, pool_after_run_hook_hands_results_to_the_loop) {
  size_t n = TT_SCALE(20000, 2000);
  tko_cq *cq = make_cq(64);
  tko_options o = tko_basic_options(2);
  o.hooks.after_run = post_after_run;
  o.hooks.user = cq;
  tko_pool *pool;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  task_seen s = {.count_by_arg = calloc(n, sizeof(uint64_t))};
  cr_assert_not_null(s.count_by_arg);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(tko_submit(pool, odd_fails, (void *)(uintptr_t)i, (int)(i % 3)), 0);
    if (i % 32 == 0) cr_assert_geq(tko_cq_drain(cq, count_task, &s, 0), 0); /* keep room */
  }
  while (s.total < n) {
    cr_assert(wait_readable(cq));
    cr_assert_geq(tko_cq_drain(cq, count_task, &s, 0), 0);
  }
  cr_assert_eq(tko_pool_destroy(pool), 0);
  for (size_t i = 0; i < n; i++) cr_assert_eq(s.count_by_arg[i], 1);
  cr_assert_eq(s.failed, n / 2);
  cr_assert_eq(tko_cq_destroy(cq), 0);
  free(s.count_by_arg);
}

Test(completion, allocator_used_and_destroy_frees_all) {
  tko_allocator a = {count_alloc, count_realloc, count_free, NULL};
  tko_cq *cq = NULL;
  cr_assert_eq(tko_cq_create(&cq, 100, &a), 0);
  cr_assert_gt(live_blocks, 0);
  int fd = tko_cq_fd(cq);
  for (int i = 0; i < 100; i++) cr_assert_eq(tko_cq_post(cq, (uint64_t)i, 0, NULL), 0);
  cr_assert_eq(live_blocks, 2); /* posts allocate nothing */
  tko_completion c[128];
  cr_assert_eq(tko_cq_take(cq, c, 128), 100);
  cr_assert_eq(tko_cq_destroy(cq), 0);
  cr_assert_eq(live_blocks, 0);
  cr_assert_eq(fcntl(fd, F_GETFD), -1); /* the descriptor is closed */
}

/* Create fails whole: with no memory for the queue or for its ring, and
 * with no descriptor left (the documented -EMFILE), it returns the error,
 * leaves out NULL and frees what it had taken; afterwards it works again. */
Test(completion, create_fails_cleanly_without_memory_or_a_descriptor) {
  tfa f;
  tfa_init(&f);
  for (long nth = 1; nth <= 2; nth++) { /* the queue, then its ring */
    tfa_fail_nth(&f, nth);
    tko_cq *cq = (tko_cq *)&f;
    cr_assert_eq(tko_cq_create(&cq, 8, &f.al), -ENOMEM, "allocation %ld failed", nth);
    cr_assert_null(cq);
    cr_assert_eq(atomic_load(&f.live), 0, "allocation %ld failed: a block leaked", nth);
  }
  tfa_heal(&f);
  tff_fds fds;
  cr_assert(tff_fds_exhaust(&fds));
  tko_cq *cq = (tko_cq *)&f;
  int rc = tko_cq_create(&cq, 8, &f.al);
  tff_fds_restore(&fds);
  cr_assert_eq(rc, -EMFILE);
  cr_assert_null(cq);
  cr_assert_eq(atomic_load(&f.live), 0, "a block leaked");
  cr_assert_eq(tko_cq_create(&cq, 8, &f.al), 0);
  cr_assert_eq(tko_cq_post(cq, 1, 0, NULL), 0);
  tko_completion c;
  cr_assert_eq(tko_cq_take(cq, &c, 1), 1);
  cr_assert_eq(c.id, 1u);
  cr_assert_eq(tko_cq_destroy(cq), 0);
  cr_assert_eq(atomic_load(&f.live), 0);
}
