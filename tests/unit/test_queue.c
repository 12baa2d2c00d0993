/* SPDX-License-Identifier: MIT */
/* Unit tests for the by-value weighted priority queue (src/structures/queue.h): pop
 * order (weight desc, FIFO for ties) over the whole int range, growth, many
 * distinct weights checked against a reference sort, interleaved push/pop
 * against a reference model, no growth in a steady push/pop stream,
 * refills after the queue empties, and where a big slab's memory comes
 * from. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tko_test.h"
#include "tko_test_sync.h"
#include "prim.h"
#include "queue.h"

static int dummy_fn(void *arg) { return arg != NULL; }

static tko__item make_item(uint64_t id, int weight) {
  tko__item it;
  memset(&it, 0, sizeof it);
  it.fn = dummy_fn;
  it.arg = (void *)(uintptr_t)(id * 7 + 1); /* distinct, checked on pop */
  it.id = id;
  it.weight = weight;
  return it;
}

/* The contract's order: higher weight first, then lower id (submit order). */
static int ref_cmp(const void *a, const void *b) {
  const tko__item *x = a, *y = b;
  if (x->weight != y->weight) return x->weight > y->weight ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

static bool ref_before(const tko__item *x, const tko__item *y) { return ref_cmp(x, y) < 0; }

/* Pushes weights[i] with ids 1..n, pops everything `batch` at a time and
 * checks the sequence against a sorted reference. */
static void check_order(const int *weights, size_t n, size_t batch, size_t capacity) {
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, capacity, NULL), 0);
  tko__item *ref = malloc(n * sizeof *ref);
  tko__item *out = malloc(n * sizeof *out);
  cr_assert(ref && out);
  for (size_t i = 0; i < n; i++) {
    ref[i] = make_item(i + 1, weights[i]);
    cr_assert_eq(tko__queue_push(&q, &ref[i]), 0);
  }
  cr_assert_eq(q.len, n);
  qsort(ref, n, sizeof *ref, ref_cmp);
  size_t got = 0;
  while (got < n) {
    size_t k = tko__queue_pop(&q, out + got, batch);
    cr_assert_gt(k, 0);
    cr_assert_leq(k, batch);
    got += k;
  }
  cr_assert_eq(got, n);
  cr_assert_eq(q.len, 0);
  cr_assert_eq(tko__queue_pop(&q, out, batch), 0, "an empty queue pops nothing");
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(out[i].id, ref[i].id, "position %zu", i);
    cr_assert_eq(out[i].weight, ref[i].weight);
    cr_assert_eq(out[i].arg, ref[i].arg, "the item is copied by value, arg intact");
    cr_assert(out[i].fn == dummy_fn);
  }
  free(ref);
  free(out);
  tko__queue_fini(&q);
}

Test(queue, empty_pops_nothing) {
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, 0, NULL), 0);
  tko__item out[4];
  cr_assert_eq(tko__queue_pop(&q, out, 4), 0);
  cr_assert_eq(q.len, 0);
  tko__queue_fini(&q);
}

Test(queue, mixed_weights_and_ties_exact_order) {
  static const int w[] = {3, 1, 3, 2, 1, 3, 0, 2, -1, 3, 1, 2, 2, 0, -1, 5, 5, 1};
  size_t n = sizeof w / sizeof w[0];
  check_order(w, n, 1, 16);
  check_order(w, n, 4, 16);
  check_order(w, n, 16, 16);
}

Test(queue, all_equal_weights_are_fifo) {
  int w[1000];
  for (size_t i = 0; i < 1000; i++) w[i] = 42;
  check_order(w, 1000, 1, 16);
  check_order(w, 1000, 7, 16);
}

Test(queue, int_min_and_int_max_do_not_overflow) {
  static const int w[] = {0,       INT_MIN,     INT_MAX, -1,          1,       INT_MIN + 1,
                          INT_MAX, INT_MAX - 1, INT_MIN, 0,           INT_MAX, -1,
                          1,       INT_MIN,     INT_MIN + 1, INT_MAX - 1};
  size_t n = sizeof w / sizeof w[0];
  check_order(w, n, 1, 16);
  check_order(w, n, 16, 16);

  /* Spell out the expected head and tail so a comparison that overflowed
   * (INT_MAX vs INT_MIN by subtraction) cannot hide behind the reference. */
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, 16, NULL), 0);
  for (size_t i = 0; i < n; i++) {
    tko__item it = make_item(i + 1, w[i]);
    cr_assert_eq(tko__queue_push(&q, &it), 0);
  }
  tko__item out[16];
  cr_assert_eq(tko__queue_pop(&q, out, 16), n);
  cr_assert_eq(out[0].weight, INT_MAX);
  cr_assert_eq(out[0].id, 3);
  cr_assert_eq(out[1].weight, INT_MAX);
  cr_assert_eq(out[1].id, 7);
  cr_assert_eq(out[2].weight, INT_MAX);
  cr_assert_eq(out[2].id, 11);
  cr_assert_eq(out[n - 1].weight, INT_MIN);
  cr_assert_eq(out[n - 1].id, 14);
  cr_assert_eq(out[n - 3].weight, INT_MIN);
  cr_assert_eq(out[n - 3].id, 2);
  tko__queue_fini(&q);
}

Test(queue, grows_geometrically_past_initial_capacity) {
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, 16, NULL), 0);
  uint32_t cap0 = q.items_cap;
  cr_assert_geq(cap0, 16);
  const size_t n = 10000;
  for (size_t i = 0; i < n; i++) {
    tko__item it = make_item(i + 1, (int)(i % 13) - 6);
    cr_assert_eq(tko__queue_push(&q, &it), 0);
  }
  cr_assert_eq(q.len, n);
  cr_assert_geq(q.items_cap, n);
  /* Geometric growth from below n never overshoots by 2x or more. */
  cr_assert_lt(q.items_cap, 2 * n);
  tko__item prev, cur;
  cr_assert_eq(tko__queue_pop(&q, &prev, 1), 1);
  for (size_t i = 1; i < n; i++) {
    cr_assert_eq(tko__queue_pop(&q, &cur, 1), 1);
    cr_assert(ref_before(&prev, &cur), "order broken at %zu", i);
    prev = cur;
  }
  cr_assert_eq(q.len, 0);
  tko__queue_fini(&q);
  /* The same data through check_order, for the exact sequence. */
  int *w = malloc(n * sizeof *w);
  for (size_t i = 0; i < n; i++) w[i] = (int)(i % 13) - 6;
  check_order(w, n, 16, 16);
  free(w);
}

/* Counts the bytes a host allocator was asked to grow to. */
static size_t host_biggest;
static void *host_alloc(void *ctx, size_t n) { (void)ctx; return malloc(n); }
static void *host_realloc(void *ctx, void *p, size_t n) {
  (void)ctx;
  if (n > host_biggest) host_biggest = n;
  return realloc(p, n);
}
static void host_free(void *ctx, void *p) { (void)ctx; free(p); }

/* Pushes n items of 3 weights, pops them all and checks the order. */
static void fill_and_drain(tko__queue *q, size_t n) {
  for (size_t i = 0; i < n; i++) {
    tko__item it = make_item(i + 1, (int)(i % 3));
    cr_assert_eq(tko__queue_push(q, &it), 0);
  }
  tko__item prev, cur;
  cr_assert_eq(tko__queue_pop(q, &prev, 1), 1);
  for (size_t i = 1; i < n; i++) {
    cr_assert_eq(tko__queue_pop(q, &cur, 1), 1);
    cr_assert(ref_before(&prev, &cur), "order broken at %zu", i);
    cr_assert_eq(cur.arg, (void *)(uintptr_t)(cur.id * 7 + 1), "item %zu intact", i);
    prev = cur;
  }
}

#if defined(__linux__)
/* How many of the process's mappings overlap [p, p + len). */
static int mappings_over(const void *p, size_t len) {
  FILE *f = fopen("/proc/self/maps", "r");
  cr_assert_not_null(f);
  uintptr_t lo = (uintptr_t)p, hi = lo + len, a, b;
  int n = 0;
  char line[512];
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "%lx-%lx", &a, &b) == 2 && a < hi && b > lo) n++;
  fclose(f);
  return n;
}
#endif

Test(queue, big_slab_is_mapped_unless_the_host_allocates) {
  const size_t n = 300000; /* 14 MiB of items: past TKO__MAP_MIN, several growths */
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, 16, NULL), 0);
  fill_and_drain(&q, n);
#if defined(__linux__)
  /* The default allocator's big slab is a huge-page-aligned mapping. */
  cr_assert_eq((uintptr_t)q.items % TKO__MAP_ALIGN, 0, "slab at %p", (void *)q.items);
  /* One mapping, however many times it grew: kernels before 6.17 cannot
   * move a range that spans two, so the next growth would fail. */
  cr_assert_eq(mappings_over(q.items, (size_t)q.items_cap * sizeof(tko__item)), 1,
               "the slab is one mapping after growing to %u items", q.items_cap);
#endif
  fill_and_drain(&q, n); /* the grown mapping is reused as it is */
  tko__queue_fini(&q);

  tko_allocator host = {host_alloc, host_realloc, host_free, NULL};
  host_biggest = 0;
  cr_assert_eq(tko__queue_init(&q, 16, &host), 0);
  fill_and_drain(&q, n);
  cr_assert_geq(host_biggest, n * sizeof(tko__item), "a host allocator sees every growth");
  tko__queue_fini(&q);
}

Test(queue, reserve_makes_pushes_allocation_free) {
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, 16, NULL), 0);
  cr_assert_eq(tko__queue_reserve(&q, 1000), 0);
  uint32_t cap = q.items_cap;
  cr_assert_geq(cap, 1000);
  for (size_t i = 0; i < 1000; i++) {
    tko__item it = make_item(i + 1, 7); /* one weight: no bucket growth either */
    cr_assert_eq(tko__queue_push(&q, &it), 0);
  }
  cr_assert_eq(q.items_cap, cap, "reserved room was used, nothing reallocated");
  tko__queue_fini(&q);
}

Test(queue, hundred_thousand_random_weights_match_reference_sort) {
  const size_t n = 100000;
  int *w = malloc(n * sizeof *w);
  cr_assert_not_null(w);
  uint64_t seed = 0x5eed1234abcdull;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = tt_rand(&seed);
    /* Mostly distinct weights over the whole int range, plus a band of
     * small weights so that ties occur too. */
    w[i] = (r & 3) == 0 ? (int)(r >> 40) % 50 - 25 : (int)(uint32_t)(r >> 32);
  }
  check_order(w, n, 16, 256);
  check_order(w, n, 1, 16);
  free(w);
}

Test(queue, interleaved_push_pop_matches_reference_model) {
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, 16, NULL), 0);
  /* Reference: an unsorted array searched for the best item on every pop;
   * slow but obviously right. */
  size_t ref_cap = 1 << 16, ref_len = 0;
  tko__item *ref = malloc(ref_cap * sizeof *ref);
  cr_assert_not_null(ref);
  uint64_t seed = 42, next_id = 1;
  size_t popped_total = 0;
  for (int round = 0; round < 400; round++) {
    /* Alternate a growing and a shrinking phase so buckets empty, get
     * purged and come back while other weights are still queued. */
    bool grow = (round / 50) % 2 == 0;
    size_t pushes = tt_rand(&seed) % (grow ? 64 : 24);
    for (size_t i = 0; i < pushes; i++) {
      uint64_t r = tt_rand(&seed);
      int weight = (r & 7) == 0 ? (int)(uint32_t)(r >> 32) : (int)(r % 20) - 10;
      tko__item it = make_item(next_id++, weight);
      cr_assert_eq(tko__queue_push(&q, &it), 0);
      cr_assert_lt(ref_len, ref_cap);
      ref[ref_len++] = it;
    }
    size_t pops = tt_rand(&seed) % (grow ? 24 : 64);
    while (pops > 0) {
      size_t want = 1 + tt_rand(&seed) % 16;
      if (want > pops) want = pops;
      tko__item out[16];
      size_t k = tko__queue_pop(&q, out, want);
      cr_assert_eq(k, want < ref_len ? want : ref_len);
      for (size_t j = 0; j < k; j++) {
        size_t best = 0;
        for (size_t m = 1; m < ref_len; m++)
          if (ref_before(&ref[m], &ref[best])) best = m;
        cr_assert_eq(out[j].id, ref[best].id, "round %d", round);
        cr_assert_eq(out[j].weight, ref[best].weight);
        ref[best] = ref[--ref_len];
        popped_total++;
      }
      pops -= want;
      if (k < want) break;
    }
    cr_assert_eq(q.len, ref_len);
  }
  cr_assert_gt(popped_total, 1000, "the model was exercised");
  free(ref);
  tko__queue_fini(&q);
}

Test(queue, steady_push_pop_does_not_grow) {
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, 64, NULL), 0);
  uint64_t id = 1;
  /* Keep 48 items queued and cycle through 500 distinct weights, so the
   * bucket table sees buckets empty and come back all the time. */
  for (int i = 0; i < 48; i++) {
    tko__item it = make_item(id++, i % 500);
    cr_assert_eq(tko__queue_push(&q, &it), 0);
  }
  const long warmup = 20000, steady = TT_SCALE(1000000L, 200000L);
  tko__item out;
  for (long i = 0; i < warmup; i++) {
    tko__item it = make_item(id, (int)(id % 500));
    id++;
    cr_assert_eq(tko__queue_push(&q, &it), 0);
    cr_assert_eq(tko__queue_pop(&q, &out, 1), 1);
  }
  uint32_t items_cap = q.items_cap, buckets_cap = q.buckets_cap, table_cap = q.table_cap;
  tko__item *slab = q.items;
  uint64_t last_id = 0;
  for (long i = 0; i < steady; i++) {
    tko__item it = make_item(id, (int)(id % 500));
    id++;
    int rc = tko__queue_push(&q, &it);
    if (rc != 0) cr_assert_eq(rc, 0, "push failed at %ld", i); /* branch keeps the loop cheap */
    size_t k = tko__queue_pop(&q, &out, 1);
    if (k != 1) cr_assert_eq(k, 1, "pop failed at %ld", i);
    last_id = out.id;
  }
  cr_assert_gt(last_id, 0);
  cr_assert_eq(q.len, 48);
  cr_assert_eq(q.items_cap, items_cap, "the slab grew in a steady state");
  cr_assert(q.items == slab, "the slab moved in a steady state");
  cr_assert_eq(q.buckets_cap, buckets_cap, "the bucket array grew in a steady state");
  cr_assert_eq(q.table_cap, table_cap, "the weight table grew in a steady state");
  cr_assert_leq(q.items_cap, 64, "48 queued items fit the initial 64 slots");
  tko__queue_fini(&q);
}

/* Bursts that drain the queue to empty: each refill hands out the slab from
 * its start again (the slab-locality reset), and order stays exact, with a
 * partial drain (queue never empty) in between to mix reused and new slots. */
Test(queue, refills_after_emptying_keep_order_and_reuse_the_slab) {
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, 16, NULL), 0);
  enum { BURST = 3000 };
  tko__item *ref = malloc(BURST * sizeof *ref), *out = malloc(BURST * sizeof *out);
  cr_assert(ref && out);
  uint64_t id = 1;
  uint32_t cap_after_first = 0;
  for (int burst = 0; burst < 6; burst++) {
    size_t n = BURST - (size_t)burst * 100;
    for (size_t i = 0; i < n; i++) {
      ref[i] = make_item(id++, (int)((i * 7 + (size_t)burst) % 5) - 2);
      cr_assert_eq(tko__queue_push(&q, &ref[i]), 0);
    }
    qsort(ref, n, sizeof *ref, ref_cmp);
    size_t got = 0;
    /* Pop half, push nothing, pop the rest 13 at a time. */
    got += tko__queue_pop(&q, out, n / 2);
    while (got < n) got += tko__queue_pop(&q, out + got, 13);
    cr_assert_eq(q.len, 0);
    for (size_t i = 0; i < n; i++)
      cr_assert_eq(out[i].id, ref[i].id, "burst %d, position %zu", burst, i);
    cr_assert_eq(q.items_used, 0, "an empty queue hands out its slab from the start");
    if (burst == 0) cap_after_first = q.items_cap;
    else cr_assert_eq(q.items_cap, cap_after_first, "a smaller burst grew the slab");
  }
  free(ref);
  free(out);
  tko__queue_fini(&q);
}

Test(queue, aging_orders_by_weight_plus_waited_time) {
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, 16, NULL), 0);
  q.aging_ns = 1000; /* one weight unit per microsecond waited */
  /* A: weight 0, queued at t=0. B: weight 1, queued 5 units later: A has
   * aged past B. C: weight 10 at t=0 beats both. D ties A's key exactly
   * (weight 2, queued 2 units after A), so the lower id, A, goes first. */
  tko__item a = make_item(1, 0), b = make_item(2, 1), c = make_item(3, 10), d = make_item(4, 2);
  a.enq_ns = 0;
  b.enq_ns = 5000;
  c.enq_ns = 0;
  d.enq_ns = 2000;
  cr_assert_eq(tko__queue_push(&q, &a), 0);
  cr_assert_eq(tko__queue_push(&q, &b), 0);
  cr_assert_eq(tko__queue_push(&q, &c), 0);
  cr_assert_eq(tko__queue_push(&q, &d), 0);
  tko__item out[4];
  cr_assert_eq(tko__queue_pop(&q, out, 4), 4);
  cr_assert_eq(out[0].id, 3);
  cr_assert_eq(out[1].id, 1);
  cr_assert_eq(out[2].id, 4);
  cr_assert_eq(out[3].id, 2);
  tko__queue_fini(&q);
}

/* Sizes past what the queue's 32-bit slot indexes can address are refused
 * up front (-EINVAL at init, -ENOMEM for a reservation), before anything is
 * allocated, rather than wrapping an index; the queue stays usable. */
Test(queue, sizes_past_the_index_range_are_refused_before_allocating) {
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, TKO__NIL / 2, NULL), -EINVAL);
  cr_assert_eq(tko__queue_init(&q, 16, NULL), 0);
  uint32_t cap = q.items_cap;
  cr_assert_eq(tko__queue_reserve(&q, (size_t)TKO__NIL / 2 + 1), -ENOMEM);
  cr_assert_eq(tko__queue_reserve_buckets(&q, (size_t)TKO__NIL / 8 + 1), -ENOMEM);
  cr_assert_eq(q.items_cap, cap, "a refused reservation grew the slab");
  tko__item it = make_item(1, 3);
  cr_assert_eq(tko__queue_push(&q, &it), 0);
  tko__item out;
  cr_assert_eq(tko__queue_pop(&q, &out, 1), 1);
  cr_assert_eq(out.id, 1u);
  tko__queue_fini(&q);
}

/* tko__queue_push_ordered (a worker's hand-back): items taken earlier
 * (lower ids, earlier stamps) and pushed back in any order land where the
 * contract's order puts them - among each other, ahead of the items of
 * their weight queued since, in new and existing buckets - with and
 * without aging. */
static uint64_t ordered_aging;

static int aged_cmp(const void *a, const void *b) {
  const tko__item *x = a, *y = b;
  __int128 kx = (__int128)x->weight * ordered_aging - (__int128)x->enq_ns;
  __int128 ky = (__int128)y->weight * ordered_aging - (__int128)y->enq_ns;
  if (!ordered_aging) kx = x->weight, ky = y->weight;
  if (kx != ky) return kx > ky ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

static void check_push_ordered(uint64_t aging_ns) {
  enum { N = 600 };
  ordered_aging = aging_ns;
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, 16, NULL), 0);
  q.aging_ns = aging_ns;
  static tko__item ref[N], out[N];
  uint64_t seed = 7;
  for (size_t i = 0; i < N; i++) {
    ref[i] = make_item(i + 1, (int)(tt_rand(&seed) % 5));
    ref[i].enq_ns = (i + 1) * 300; /* submit order, as stamped */
  }
  /* The later half first, plainly; then the earlier half handed back,
   * shuffled. */
  for (size_t i = N / 2; i < N; i++) cr_assert_eq(tko__queue_push(&q, &ref[i]), 0);
  size_t order[N / 2];
  for (size_t k = 0; k < N / 2; k++) order[k] = k;
  for (size_t k = N / 2 - 1; k > 0; k--) {
    size_t j = tt_rand(&seed) % (k + 1), t = order[k];
    order[k] = order[j];
    order[j] = t;
  }
  for (size_t k = 0; k < N / 2; k++) cr_assert_eq(tko__queue_push_ordered(&q, &ref[order[k]]), 0);
  cr_assert_eq(q.len, N);
  qsort(ref, N, sizeof *ref, aged_cmp);
  size_t got = 0;
  while (got < N) got += tko__queue_pop(&q, out + got, 7);
  for (size_t i = 0; i < N; i++) cr_assert_eq(out[i].id, ref[i].id, "position %zu", i);
  tko__queue_fini(&q);
}

Test(queue, push_ordered_puts_items_back_in_place) {
  check_push_ordered(0);
  check_push_ordered(1000); /* aging: a new head re-sifts its bucket */
}

/* Pops every item; checks the ids in order. */
static void pops_in_order(tko__queue *q, const uint64_t *ids, size_t n) {
  for (size_t i = 0; i < n; i++) {
    tko__item out;
    cr_assert_eq(tko__queue_pop(q, &out, 1), 1);
    cr_assert_eq(out.id, ids[i], "position %zu", i);
  }
  cr_assert_eq(q->len, 0u);
}

/* A pushed-back item never passes one that came in by tko__queue_push,
 * whatever their ids (another thread's task, in a pool of rings): so its
 * scan is bounded by the pushed-back items, however deep the bucket. */
Test(queue, push_ordered_stays_ahead_of_plain_pushes) {
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, 16, NULL), 0);
  for (uint64_t id = 1; id <= 3; id++) {
    tko__item it = make_item(id, 0);
    cr_assert_eq(tko__queue_push(&q, &it), 0);
  }
  tko__item back = make_item(9, 0);
  cr_assert_eq(tko__queue_push_ordered(&q, &back), 0);
  pops_in_order(&q, (uint64_t[]){9, 1, 2, 3}, 4);
  tko__queue_fini(&q);
}

/* The count of pushed-back items at a bucket's head follows pops and
 * removals: once they are gone, a new one goes ahead of a plain push. */
static void forgets_taken_back(bool by_removal) {
  tko__queue q;
  cr_assert_eq(tko__queue_init(&q, 16, NULL), 0);
  tko__item a = make_item(2, 0), b = make_item(4, 0), plain = make_item(1, 0), c = make_item(6, 0);
  a.ctx = 8; /* a group's record, say */
  cr_assert_eq(tko__queue_push_ordered(&q, &a), 0);
  cr_assert_eq(tko__queue_push_ordered(&q, &b), 0);
  tko__item out;
  if (by_removal) cr_assert_eq(tko__queue_remove_ctx(&q, 8, &out, 1), 1);
  else cr_assert_eq(tko__queue_pop(&q, &out, 1), 1);
  cr_assert_eq(out.id, 2u);
  cr_assert_eq(tko__queue_push(&q, &plain), 0);
  cr_assert_eq(tko__queue_push_ordered(&q, &c), 0);
  pops_in_order(&q, (uint64_t[]){4, 6, 1}, 3);
  tko__queue_fini(&q);
}

Test(queue, push_ordered_counts_pops_and_removals) {
  forgets_taken_back(false);
  forgets_taken_back(true);
}
