/* SPDX-License-Identifier: MIT */
/* Memory goes back after a burst: the queue's slab and the submitting
 * thread's ring, grown to hold a backlog, shrink back to their first size on
 * tko_pool_trim once nothing is queued, and by itself once the pool has
 * stayed idle for elastic_idle_ms. Measured with stats.queue_bytes and with
 * an allocator that counts the bytes it has out, which the test waits on
 * (no sleep): the decay test waits for the allocator to see the slab come
 * back. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "taskorch.h"
#include "tko_test.h"
#include "tko_test_feature.h"
#include "tko_test_sync.h"

enum { BURST = 100000, ITEM_GUESS = 32 /* bytes a queued task takes, at least */ };

/* Counts the bytes handed out and not given back (a size header before each
 * block); every change wakes waiters. */
typedef struct bytes_alloc {
  pthread_mutex_t mu; /* protects live */
  pthread_cond_t cv;  /* broadcast when live changes */
  long long live;
  tko_allocator al;
} bytes_alloc;

/* 64 bytes, so that blocks keep the cache-line alignment the pool's own
 * structures ask for (aligned_alloc below). */
typedef union header {
  size_t size;
  _Alignas(64) unsigned char pad[64];
} header;

static void ba_add(bytes_alloc *b, long long d) {
  pthread_mutex_lock(&b->mu);
  b->live += d;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

static void *ba_alloc(void *ctx, size_t size) {
  size_t total = (sizeof(header) + size + 63) / 64 * 64;
  header *h = aligned_alloc(64, total);
  if (!h) return NULL;
  h->size = size;
  ba_add(ctx, (long long)size);
  return h + 1;
}

static void ba_free(void *ctx, void *p);

static void *ba_realloc(void *ctx, void *p, size_t size) {
  if (!p) return ba_alloc(ctx, size);
  void *n = ba_alloc(ctx, size);
  if (!n) return NULL;
  size_t was = ((header *)p - 1)->size;
  memcpy(n, p, was < size ? was : size);
  ba_free(ctx, p);
  return n;
}

static void ba_free(void *ctx, void *p) {
  if (!p) return;
  header *h = (header *)p - 1;
  ba_add(ctx, -(long long)h->size);
  free(h);
}

static void ba_init(bytes_alloc *b) {
  memset(b, 0, sizeof *b);
  pthread_mutex_init(&b->mu, NULL);
  pthread_cond_init(&b->cv, NULL);
  b->al = (tko_allocator){ba_alloc, ba_realloc, ba_free, b};
}

static long long ba_live(bytes_alloc *b) {
  pthread_mutex_lock(&b->mu);
  long long v = b->live;
  pthread_mutex_unlock(&b->mu);
  return v;
}

/* Waits until the live bytes drop to at most limit; false after TT_LONG_MS. */
static bool ba_wait_leq(bytes_alloc *b, long long limit) {
  struct timespec dl;
  tt_deadline(&dl, TT_LONG_MS);
  bool ok = true;
  pthread_mutex_lock(&b->mu);
  while (b->live > limit && ok) ok = pthread_cond_timedwait(&b->cv, &b->mu, &dl) != ETIMEDOUT;
  ok = b->live <= limit;
  pthread_mutex_unlock(&b->mu);
  return ok;
}

/* Queues a burst on a paused pool (so it really piles up), checks the slab
 * grew, then lets it run. Returns the bytes it left held (queue_bytes); *last_call,
 * if not NULL, gets the time its last submit was called. */
static uint64_t burst_at(tko_pool *pool, uint64_t *last_call) {
  uint64_t before = tf_stats(pool).queue_bytes;
  cr_assert_eq(tko_pool_pause(pool), 0);
  for (int i = 0; i < BURST; i++) {
    if (last_call && i == BURST - 1) *last_call = tt_now_ns();
    cr_assert_eq(tko_submit(pool, tt_nop_fn, NULL, 0), 0);
  }
  /* A trim with tasks queued gives nothing back. */
  cr_assert_eq(tko_pool_trim(pool), 0);
  uint64_t peak = tf_stats(pool).queue_bytes;
  cr_assert_geq(peak, (uint64_t)BURST * ITEM_GUESS);
  cr_assert_gt(peak, before);
  cr_assert_eq(tko_pool_resume(pool), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  /* What the burst grew, kept for the next one: the backlog waited in this
   * thread's submit ring, then in the queue. */
  uint64_t held = tf_stats(pool).queue_bytes;
  cr_assert_geq(held, peak);
  return held;
}

static uint64_t burst(tko_pool *pool) {
  return burst_at(pool, NULL);
}

static void trim_case(const tko_allocator *al) {
  tko_options o = tko_basic_options(1);
  o.allocator = al;
  o.elastic_idle_ms = TKO_MAX_IDLE_MS; /* no decay during the test: the call does it */
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  uint64_t fresh = tf_stats(pool).queue_bytes;
  for (int round = 0; round < 2; round++) {
    uint64_t peak = burst(pool);
    cr_assert_eq(tf_stats(pool).queue_bytes, peak, "nothing is given back before the call");
    cr_assert_eq(tko_pool_trim(pool), 0);
    cr_assert_eq(tf_stats(pool).queue_bytes, fresh);
  }
  /* And the pool still works at its initial size. */
  cr_assert_eq(tko_submit(pool, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  cr_assert_eq(tko_pool_destroy(pool), 0);
}

Test(trim, the_call_gives_a_bursts_slab_back) {
  trim_case(NULL); /* the default allocator: past 512 KiB a mapping of its own */
  bytes_alloc b;
  ba_init(&b);
  trim_case(&b.al);
  cr_assert_eq(ba_live(&b), 0);
  cr_assert_eq(tko_pool_trim(NULL), -EINVAL);
}

Test(trim, the_slab_decays_once_the_pool_stays_idle) {
  bytes_alloc b;
  ba_init(&b);
  tko_options o = tko_elastic_options(1, 1, 20);
  o.allocator = &b.al;
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  /* This thread's first submit claims its submit ring, kept until destroy. */
  cr_assert_eq(tko_submit(pool, tt_nop_fn, NULL, 0), 0);
  cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
  long long fresh_live = ba_live(&b);
  uint64_t fresh = tf_stats(pool).queue_bytes;
  cr_assert_gt(burst(pool), fresh); /* the slab grew (burst checks it while paused) */
  /* No call: an idle worker gives the slab back after elastic_idle_ms. */
  cr_assert(ba_wait_leq(&b, fresh_live), "the burst's memory stayed");
  cr_assert_eq(tf_stats(pool).queue_bytes, fresh);
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(ba_live(&b), 0);
}

/* The decay waits for the pool to stay idle, not one worker: while one
 * worker runs task after task, the others may sleep through all of them,
 * unwoken (a submit wakes the latest sleeper, or nobody while a worker
 * searches). A trim then, between two bursts, would make the next burst
 * grow the slab again: an allocation a burst
 * (pool/steady_state_allocates_nothing_per_task saw it on a loaded
 * machine). One task at a time keeps coming here for PERIODS decay
 * periods; the slab the first burst grew must stay.
 *
 * The decay is right once no task was submitted for DECAY_MS, so the scene
 * holds only while this thread submits more often than that: a read of the
 * slab counts if less than DECAY_MS passed from the call of the submit
 * before it (and from the previous submit's call to its return, the first
 * from the burst's last submit). A preempted test thread breaks that; the
 * scene then stops and returns false, for tt_rerun to run it again. */
/* Under a sanitizer the first burst drains slower, on a loaded machine
 * past a 250 ms decay: a longer decay, over fewer periods. */
enum { DECAY_MS = TT_SCALE(250, 1000), PERIODS = TT_SCALE(8, 3) };

static bool keeps_working(void *arg) {
  (void)arg;
  const uint64_t decay_ns = DECAY_MS * 1000000ull;
  bytes_alloc b;
  ba_init(&b);
  tko_options o = tko_basic_options(3);
  o.allocator = &b.al;
  o.elastic_idle_ms = DECAY_MS;
  tko_pool *pool = NULL;
  cr_assert_eq(tko_pool_create(&pool, &o), 0);
  uint64_t last_call = 0; /* burst_at sets it */
  uint64_t peak = burst_at(pool, &last_call);
  uint64_t end = tt_now_ns() + PERIODS * decay_ns;
  long rounds = 0;
  bool met = true;
  while (met && tt_now_ns() < end) {
    uint64_t call = tt_now_ns();
    cr_assert_eq(tko_submit(pool, tt_nop_fn, NULL, 0), 0);
    met = tt_now_ns() - last_call < decay_ns;
    last_call = call;
    cr_assert_eq(tko_pool_wait_idle(pool, -1), 0);
    uint64_t bytes = tf_stats(pool).queue_bytes;
    met = met && tt_now_ns() - call < decay_ns;
    rounds++;
    if (met) cr_assert_eq(bytes, peak, "the slab decayed after %ld tasks (%llu, not %llu)", rounds, (unsigned long long)bytes, (unsigned long long)peak);
  }
  cr_assert_eq(tko_pool_destroy(pool), 0);
  cr_assert_eq(ba_live(&b), 0);
  return met;
}

Test(trim, no_decay_while_the_pool_keeps_working) {
  cr_assert(tt_rerun(keeps_working, NULL),
            "this thread went %d ms without a submit in every attempt: the test proved nothing", DECAY_MS);
}

/* Trims at the same moment (the pool's own idle trim is one too): each
 * returns with the memory back, not while another still frees what it
 * took (a trim takes a ring's spare segments whole, then frees them). */
enum { TRIMMERS = 4, TRIM_ROUNDS = TT_SCALE(20, 5), TRIM_BURST = TT_SCALE(3 * 20000, 3 * 4000) };

typedef struct trim_race {
  tko_pool *pool;
  pthread_barrier_t go;
  uint64_t fresh;
  atomic_int late;
} trim_race;

static void *trim_at_once(void *arg) {
  trim_race *t = arg;
  pthread_barrier_wait(&t->go);
  if (tko_pool_trim(t->pool) != 0 || tf_stats(t->pool).queue_bytes != t->fresh)
    atomic_fetch_add(&t->late, 1);
  return NULL;
}

static void *burst_from_a_thread(void *arg) {
  for (int i = 0; i < TRIM_BURST / 3; i++) cr_assert_eq(tko_submit(arg, tt_nop_fn, NULL, 0), 0);
  return NULL;
}

Test(trim, trims_at_the_same_moment_each_return_with_the_memory_back) {
  for (int round = 0; round < TRIM_ROUNDS; round++) {
    trim_race t = {.late = 0};
    tko_options o = tko_basic_options(2);
    o.elastic_idle_ms = TKO_MAX_IDLE_MS; /* only these trims */
    cr_assert_eq(tko_pool_create(&t.pool, &o), 0);
    t.fresh = tf_stats(t.pool).queue_bytes;
    cr_assert_eq(tko_pool_pause(t.pool), 0);
    pthread_t th[TRIMMERS];
    for (int i = 0; i < 3; i++)
      cr_assert_eq(pthread_create(&th[i], NULL, burst_from_a_thread, t.pool), 0);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    cr_assert_eq(tko_pool_resume(t.pool), 0);
    cr_assert_eq(tko_pool_wait_idle(t.pool, -1), 0);
    pthread_barrier_init(&t.go, NULL, TRIMMERS);
    for (int i = 0; i < TRIMMERS; i++)
      cr_assert_eq(pthread_create(&th[i], NULL, trim_at_once, &t), 0);
    for (int i = 0; i < TRIMMERS; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&t.go);
    cr_assert_eq(atomic_load(&t.late), 0, "round %d: a trim returned before the memory was back",
                 round);
    cr_assert_eq(tko_pool_destroy(t.pool), 0);
  }
}
