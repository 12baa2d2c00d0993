/* SPDX-License-Identifier: MIT */
/* bench_combining: the TreeDB seed (update-combiner lanes) done safely.
 *
 * W writer threads apply read-modify-write updates to documents of a shared
 * in-memory table with one secondary index (value -> doubly linked list of
 * documents). An update reads its document, computes the new state (real
 * arithmetic, --prepare-ns), then writes the document and moves it between
 * index lists. Modes:
 *
 *   global   each writer takes one global mutex per update and does the
 *            whole read-modify-write under it (the seed's base)
 *   lanes    keyed lanes, one lane per document key (--lanes of them): the
 *            writer submits the update and waits for it (--window in
 *            flight); the lane's batch callback prepares every update of
 *            the drained batch without a lock (the lane owns its
 *            documents), then takes the index lock once and applies them all
 *   sharded  the same with a small lane table (--shards lanes): documents
 *            share lanes by the table's collision rule, so batches are larger
 *   wait     keyed lanes and the same batch callback, but each writer calls
 *            tko_lanes_submit_wait, one update at a time (window 1): on an
 *            idle lane the writer applies its update itself, with what other
 *            writers appended meanwhile (flat combining); on a busy one it
 *            sleeps until the lane's runner applied it
 *
 * Updates to one document in one batch are prepared in order, each from
 * the state the previous one planned (the "merge" of the seed's prepared
 * plans), so no update is lost. Reported: docs/s and ns per update (median
 * of --runs), updates per batch (lane stats: completed / visits), and the
 * speedup over global. Every run checks that the counters add up to the
 * updates made and that the index agrees with the documents. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "taskorch.h"
#include "taskorch/lanes.h"

enum { M_GLOBAL, M_LANES, M_SHARDED, M_WAIT, MODES };
static const char *mode_name[MODES] = {"global mutex", "keyed lanes + batch", "sharded lanes",
                                       "lanes + submit_wait"};

typedef struct doc {
  uint64_t field[6];
  uint64_t counter;   /* updates applied */
  uint32_t value;     /* the indexed field */
  int32_t prev, next; /* index list links (index_mu) */
} doc;

typedef struct table {
  doc *docs;
  long ndocs, nvals;
  int32_t *heads;           /* per indexed value: first document, -1 = none */
  pthread_mutex_t index_mu; /* the index; in global mode, everything */
  uint64_t prepare_iters;
} table;

struct writer;

typedef struct req {
  struct writer *w;
  uint32_t doc;
  uint64_t delta;
  /* The planned state, filled by prepare. */
  uint64_t field, counter;
  uint32_t value;
  bool busy; /* in flight (the writer's mu) */
  bool warm; /* the untimed first use of a lane: applies nothing */
} req;

typedef struct writer {
  table *t;
  tko_lanes *lanes;
  int mode;
  long updates, window;
  uint64_t rng;
  req *reqs; /* window slots */
  pthread_barrier_t *start;
  pthread_mutex_t mu; /* guards done, inflight and the slots' busy flags */
  pthread_cond_t cv;  /* signalled on each completion */
  long done, inflight;
  long next_slot;          /* where the search for a free slot starts */
  uint64_t t_start, t_end; /* this writer's first submit, last acknowledgement */
} writer;

static uint64_t xorshift(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* Plans r from a base state (the document, or an earlier plan). */
static void prepare(table *t, req *r, const uint64_t *field, uint64_t counter) {
  uint64_t h = bench_work(t->prepare_iters, field[counter % 6] ^ r->delta ^ counter);
  r->field = h;
  r->counter = counter + 1;
  r->value = (uint32_t)(h % (uint64_t)t->nvals);
}

static void unlink_doc(table *t, int32_t i) {
  doc *d = &t->docs[i];
  if (d->prev >= 0)
    t->docs[d->prev].next = d->next;
  else
    t->heads[d->value] = d->next;
  if (d->next >= 0) t->docs[d->next].prev = d->prev;
}

static void link_doc(table *t, int32_t i) {
  doc *d = &t->docs[i];
  d->prev = -1;
  d->next = t->heads[d->value];
  if (d->next >= 0) t->docs[d->next].prev = i;
  t->heads[d->value] = i;
}

/* Writes the planned state; index_mu held. */
static void apply(table *t, const req *r) {
  doc *d = &t->docs[r->doc];
  unlink_doc(t, (int32_t)r->doc);
  d->field[r->counter % 6] = r->field;
  d->counter = r->counter;
  d->value = r->value;
  link_doc(t, (int32_t)r->doc);
}

/* Acknowledges r to its writer. Completions of one writer can come out of
 * order (its updates go to different lanes), so each slot has its own flag. */
static void complete(req *r) {
  writer *w = r->w; /* read before the slot is handed back */
  if (!w) return;   /* wait mode: the writer's submit_wait returns instead */
  pthread_mutex_lock(&w->mu);
  r->busy = false;
  w->inflight--;
  w->done++;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* The batch callback: prepare all without a lock (this lane owns these
 * documents), apply all under one index lock, then acknowledge. */
static void apply_batch(void *user, const tko_lane_batch *b) {
  table *t = user;
  if (b->count == 1 && ((req *)b->tasks[0].arg)->warm) return;
  for (size_t i = 0; i < b->count; i++) {
    req *r = b->tasks[i].arg;
    const doc *d = &t->docs[r->doc];
    uint64_t field[6], counter = d->counter;
    memcpy(field, d->field, sizeof field);
    /* Earlier updates of the same document in this batch are not applied
     * yet: start from their plans, in order (the seed's plan merge). */
    for (size_t j = 0; j < i; j++) {
      const req *q = b->tasks[j].arg;
      if (q->doc != r->doc) continue;
      field[q->counter % 6] = q->field;
      counter = q->counter;
    }
    prepare(t, r, field, counter);
  }
  pthread_mutex_lock(&t->index_mu);
  for (size_t i = 0; i < b->count; i++)
    apply(t, b->tasks[i].arg);
  pthread_mutex_unlock(&t->index_mu);
  for (size_t i = 0; i < b->count; i++)
    complete(b->tasks[i].arg);
}

static void *writer_main(void *arg) {
  writer *w = arg;
  table *t = w->t;
  pthread_barrier_wait(w->start);
  w->t_start = bench_now_ns();
  for (long u = 0; u < w->updates; u++) {
    uint32_t d = (uint32_t)(xorshift(&w->rng) % (uint64_t)t->ndocs);
    if (w->mode == M_GLOBAL) {
      req r = {.w = w, .doc = d, .delta = (uint64_t)u};
      pthread_mutex_lock(&t->index_mu);
      prepare(t, &r, t->docs[d].field, t->docs[d].counter);
      apply(t, &r);
      pthread_mutex_unlock(&t->index_mu);
      continue;
    }
    if (w->mode == M_WAIT) {
      req r = {.w = NULL, .doc = d, .delta = (uint64_t)u}; /* on the stack: the call waits */
      int rc = tko_lanes_submit_wait(w->lanes, d, NULL, &r, 0);
      if (rc) bench_die("tko_lanes_submit_wait: %s", tko_strerror(rc));
      continue;
    }
    pthread_mutex_lock(&w->mu);
    while (w->inflight >= w->window)
      pthread_cond_wait(&w->cv, &w->mu);
    req *r = NULL;
    for (long k = 0; !r; k++) {
      req *q = &w->reqs[(w->next_slot + k) % w->window];
      if (!q->busy) r = q;
    }
    w->next_slot = (r - w->reqs + 1) % w->window;
    *r = (req){.w = w, .doc = d, .delta = (uint64_t)u, .busy = true};
    w->inflight++;
    pthread_mutex_unlock(&w->mu);
    int rc = tko_lanes_submit(w->lanes, d, NULL, r, 0);
    if (rc) bench_die("tko_lanes_submit: %s", tko_strerror(rc));
  }
  if (w->mode != M_GLOBAL && w->mode != M_WAIT) {
    pthread_mutex_lock(&w->mu);
    while (w->done < w->updates)
      pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
  }
  w->t_end = bench_now_ns();
  return NULL;
}

static void table_init(table *t, long ndocs, long nvals, uint64_t prepare_iters) {
  t->ndocs = ndocs;
  t->nvals = nvals;
  t->prepare_iters = prepare_iters;
  t->docs = calloc((size_t)ndocs, sizeof *t->docs);
  t->heads = malloc((size_t)nvals * sizeof *t->heads);
  if (!t->docs || !t->heads) bench_die("out of memory");
  for (long v = 0; v < nvals; v++)
    t->heads[v] = -1;
  for (long i = 0; i < ndocs; i++) {
    doc *d = &t->docs[i];
    for (int f = 0; f < 6; f++)
      d->field[f] = (uint64_t)i * 6 + (uint64_t)f + 1;
    d->value = (uint32_t)(i % nvals);
    link_doc(t, (int32_t)i);
  }
  pthread_mutex_init(&t->index_mu, NULL);
}

/* Counters add up, and the index holds each document once, in its list. */
static bool table_check(const table *t, long updates) {
  uint64_t sum = 0;
  for (long i = 0; i < t->ndocs; i++)
    sum += t->docs[i].counter;
  long seen = 0;
  for (long v = 0; v < t->nvals; v++)
    for (int32_t i = t->heads[v], prev = -1; i >= 0; prev = i, i = t->docs[i].next) {
      if (t->docs[i].value != (uint32_t)v || t->docs[i].prev != prev || ++seen > t->ndocs)
        return false;
    }
  return sum == (uint64_t)updates && seen == t->ndocs;
}

typedef struct result {
  double ns, per_batch;
} result;

static result run_once(bench *b, int mode, long writers, long updates, long ndocs,
                       uint64_t prepare_iters, long workers, long lanes, long shards,
                       long max_drain, long window) {
  table t;
  table_init(&t, ndocs, ndocs / 10 ? ndocs / 10 : 1, prepare_iters);
  tko_pool *pool = NULL;
  tko_lanes *l = NULL;
  tko_lane_stats warmed = {0};
  if (mode != M_GLOBAL) {
    tko_options o = tko_basic_options((unsigned)workers);
    int rc = tko_pool_create(&pool, &o);
    if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
    tko_lane_options lo = tko_lane_default_options();
    lo.lanes = (unsigned)(mode == M_SHARDED ? shards : lanes);
    lo.max_drain = (unsigned)max_drain;
    lo.batch = apply_batch;
    lo.user = &t;
    rc = tko_lanes_create(&l, pool, &lo);
    if (rc) bench_die("tko_lanes_create: %s", tko_strerror(rc));
    /* Untimed: each document's lane used once, so its ring and its lines
     * exist, as the documents' do for the global mutex (table_init). A
     * host's table lives on; a first use per lane is setup. */
    for (long d = 0; d < ndocs; d++) {
      req warm = {.warm = true};
      rc = tko_lanes_submit_wait(l, (uint64_t)d, NULL, &warm, 0);
      if (rc) bench_die("tko_lanes_submit_wait (warm-up): %s", tko_strerror(rc));
    }
    tko_lanes_stats(l, &warmed);
  }
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)writers + 1);
  writer *w = calloc((size_t)writers, sizeof *w);
  pthread_t *th = calloc((size_t)writers, sizeof *th);
  if (!w || !th) bench_die("out of memory");
  for (long i = 0; i < writers; i++) {
    w[i] = (writer){.t = &t,
                    .lanes = l,
                    .mode = mode,
                    .window = window,
                    .start = &start,
                    .updates = updates / writers + (i < updates % writers),
                    .rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)};
    w[i].reqs = calloc((size_t)window, sizeof *w[i].reqs);
    if (!w[i].reqs) bench_die("out of memory");
    pthread_mutex_init(&w[i].mu, NULL);
    pthread_cond_init(&w[i].cv, NULL);
    if (pthread_create(&th[i], NULL, writer_main, &w[i])) bench_die("pthread_create failed");
  }
  bench_wait_others_asleep(500);
  pthread_barrier_wait(&start);
  /* Timed by the writers themselves: first start to last end. (The main
   * thread may not run again until a short run is over.) */
  uint64_t t0 = UINT64_MAX, t1 = 0;
  for (long i = 0; i < writers; i++) {
    pthread_join(th[i], NULL);
    if (w[i].t_start < t0) t0 = w[i].t_start;
    if (w[i].t_end > t1) t1 = w[i].t_end;
  }
  result res = {.ns = (double)(t1 - t0), .per_batch = 1};
  if (l) {
    tko_lane_stats st;
    tko_lanes_stats(l, &st);
    uint64_t visits = st.visits - warmed.visits, completed = st.completed - warmed.completed;
    res.per_batch = visits ? (double)completed / (double)visits : 0;
    tko_lanes_destroy(l);
    tko_pool_destroy(pool);
  }
  bench_check(b, table_check(&t, updates), "%s, %ld writers: counters or index inconsistent",
              mode_name[mode], writers);
  for (long i = 0; i < writers; i++) {
    pthread_mutex_destroy(&w[i].mu);
    pthread_cond_destroy(&w[i].cv);
    free(w[i].reqs);
  }
  pthread_barrier_destroy(&start);
  pthread_mutex_destroy(&t.index_mu);
  free(w);
  free(th);
  free(t.docs);
  free(t.heads);
  return res;
}

int main(int argc, char **argv) {
  bench_list writers;
  long updates, docs, workers, lanes, shards, max_drain, window;
  double prepare_ns;
  const char *modes;
  bench_opt opts[] = {
      {"writers", BENCH_OPT_LIST, &writers, "1,2,4,8,16,32,64", "1,4", 1, 4096,
       "writer thread counts"},
      {"updates", BENCH_OPT_LONG, &updates, "60000", "4000", 1, 1e9,
       "updates per run, all writers"},
      {"docs", BENCH_OPT_LONG, &docs, "100000", "2000", 10, 1e8, "documents (the seed's 100,000)"},
      {"prepare-ns", BENCH_OPT_DOUBLE, &prepare_ns, "500", NULL, 0, 1e7,
       "read-modify-write work per update (real arithmetic)"},
      {"workers", BENCH_OPT_LONG, &workers, "2", NULL, 1, 1024, "pool workers (lane modes)"},
      {"lanes", BENCH_OPT_LONG, &lanes, "4096", NULL, 1, TKO_MAX_LANES, "lane table, keyed mode"},
      {"shards", BENCH_OPT_LONG, &shards, "8", NULL, 1, TKO_MAX_LANES,
       "lane table, sharded mode (the seed's UPDATE_COMBINE_SHARDS=8)"},
      {"max-drain", BENCH_OPT_LONG, &max_drain, "32", NULL, 1, TKO_MAX_LANE_DRAIN,
       "updates a lane visit takes at most"},
      {"window", BENCH_OPT_LONG, &window, "1", NULL, 1, 4096,
       "updates a writer has in flight in the lanes and sharded modes (1 = wait for each, "
       "like the seed's synchronous path; the submit_wait mode always has 1)"},
      {"modes", BENCH_OPT_STRING, &modes, "lanes,sharded,wait", NULL, 0, 0,
       "lane modes measured beside the global mutex (the ratios' base, always run): "
       "lanes, sharded, wait"},
  };
  bench *b = bench_init_runs(argc, argv, "bench_combining",
                        "TreeDB seed: read-modify-write updates to a shared table with one "
                        "secondary index, global mutex vs keyed lanes with batch apply vs lanes "
                        "sharded by key vs keyed lanes with submit_wait (flat combining).",
                        opts, sizeof opts / sizeof opts[0], 3);
  bool run_mode[MODES] = {[M_GLOBAL] = true};
  static const char *mode_key[MODES] = {"global", "lanes", "sharded", "wait"};
  for (const char *m = modes; *m;) {
    size_t len = strcspn(m, ",");
    int found = -1;
    for (int k = 0; k < MODES; k++)
      if (strlen(mode_key[k]) == len && !strncmp(m, mode_key[k], len)) found = k;
    if (found < 0) bench_die("--modes: unknown mode '%.*s' (lanes, sharded, wait)", (int)len, m);
    run_mode[found] = true;
    m += len + (m[len] == ',');
  }
  uint64_t iters = bench_work_iters(prepare_ns);
  bench_config(b, "arithmetic",
               "bench_work at %.3f ns per iteration (calibrated now): %llu per "
               "update",
               bench_work_calibrate(), (unsigned long long)iters);
  bench_config(b, "index", "%ld distinct values, lists of documents", docs / 10 ? docs / 10 : 1);
  size_t runs = (size_t)b->runs;
  result *res = calloc(writers.n * MODES * runs, sizeof *res);
  if (!res) bench_die("out of memory");
#define RES(s, m, r) res[((s)*MODES + (m)) * runs + (r)]
  for (size_t r = 0; r < runs; r++)
    for (size_t s = 0; s < writers.n; s++)
      for (int m = 0; m < MODES; m++)
        if (run_mode[m])
          RES(s, m, r) = run_once(b, m, writers.v[s], updates, docs, iters, workers, lanes, shards,
                                max_drain, window);

  bench_table *t = bench_table_new(b, "combining", "Read-modify-write updates (medians)");
  double *v = calloc(runs, sizeof *v);
  for (size_t s = 0; s < writers.n; s++) {
    double global = 0;
    for (int m = 0; m < MODES; m++) {
      if (!run_mode[m]) continue;
      for (size_t r = 0; r < runs; r++)
        v[r] = RES(s, m, r).ns;
      double ns = bench_median(v, runs);
      if (m == M_GLOBAL) global = ns;
      for (size_t r = 0; r < runs; r++)
        v[r] = RES(s, m, r).per_batch;
      double pb = bench_median(v, runs);
      bench_row(t);
      bench_cell_int(t, "writers", writers.v[s]);
      bench_cell_str(t, "mode", "%s", mode_name[m]);
      bench_cell_num(t, "docs/s", "%.0f", (double)updates / ns * 1e9);
      bench_cell_num(t, "ns/update", "%.0f", ns / (double)updates);
      bench_cell_num(t, "updates/batch", "%.2f", pb);
      bench_cell_num(t, "vs global", "%.2f", global / ns);
    }
  }
  bench_table_print(t);
  bench_note(b, "Lane modes pay a hand-off per update (submit, a worker runs the batch, the "
                "writer is woken), which the global mutex does not; they win only where the lock "
                "was the wall: many writers, prepare work worth running outside the lock, and "
                "batches that carry several updates per index-lock acquisition. With W writers "
                "and window 1 there are at most W updates in flight, so a batch carries at most "
                "W / lanes-in-use updates. The submit_wait mode runs an idle lane on the writer "
                "itself (no hand-off) and batches what other writers appended meanwhile.");
  free(v);
  free(res);
  return bench_finish(b);
}
