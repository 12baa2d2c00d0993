/* SPDX-License-Identifier: MIT */
/* The sharing audit's recorder (audit.h): a lock-free open-addressed table
 * keyed by cache line, each entry a few relaxed counters and two bitmaps of
 * the threads that wrote and read the line. Compiled only with
 * -DTKO_SHARING_AUDIT=ON. Its own atomics use stdatomic.h directly, never
 * the audited wrappers.
 *
 * A line's demand is the number of transfers between cores it needs per
 * task, at most, in the steady state. A write moves the line only if
 * another thread touched it since; between two writes of the line's top
 * writer (the thread that wrote it most) that takes a write by another
 * thread (two moves: there and back) or a read by one. So
 *   demand = min(writes, 2 x writes by others than the top writer
 *                        + loads by a thread other than the last writer) / tasks.
 * For a line that many threads write about equally (a shared tail) that is
 * every write, and depends on no timing; for a line one thread writes and
 * others read, the read term (which does depend on timing) bounds it; a
 * private line's demand is 0. The worst line's demand times the line
 * transfer time is a lower bound on the time per task of the whole pool
 * (benchmarks/MODEL.md).
 *
 * A lock's critical sections run one at a time, so the lines its holders
 * fetch add up to one serial cost however many lines they spread over:
 * per lock, the sum over shared lines of min(accesses under it, writes)
 * bounds those fetches (a holder fetches a line at most once per write).
 *
 * Orderings: every counter and bitmap is relaxed, since they are read only
 * after the audited threads have stopped (the driver joins its producers
 * and waits for the pool to go idle, which orders their accesses before
 * the report's reads). */
#include "audit.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* TABLE_BITS: room for every line a run touches (the self-check fails on
 * any access not recorded). The submit rings' segments are lines too, and
 * how many a run uses depends on how far the producers get ahead of the
 * workers, so the table is far larger than a run with the workers keeping
 * up needs. Its entries are virtual memory: only the pages of lines
 * touched are ever written. */
enum { LINE_SHIFT = 6, TABLE_BITS = 20, PROBES = 128, THREADS_MAX = 64, LABELS_MAX = 32 };
#define TABLE_SIZE ((size_t)1 << TABLE_BITS)

typedef struct entry {
  atomic_uintptr_t key; /* line number + 1; 0: empty. Set once, never cleared. */
  atomic_uint_fast64_t writers, readers;
  atomic_uint_fast64_t loads, stores, rmws, cas_failed, handoffs, foreign_loads;
  atomic_int last_writer;                      /* audit thread id + 1; 0: none since the reset */
  atomic_uint_fast64_t locked;                 /* accesses under a queue lock */
  atomic_size_t under;                         /* that lock's word's entry index + 1 */
  atomic_uint_fast32_t writes_by[THREADS_MAX]; /* per audit thread id */
} entry;

static entry table[TABLE_SIZE];
static atomic_uint_fast64_t overflow; /* accesses not recorded: the table was full */
static atomic_int next_tid;
static const char *_Atomic roles[THREADS_MAX];
static _Thread_local int self_id = -1;
static _Thread_local int locked;             /* queue locks the thread holds */
static _Thread_local size_t held = SIZE_MAX; /* the outermost one's entry index */

static struct {
  const char *name;
  uintptr_t base;
  size_t size;
} labels[LABELS_MAX];
static atomic_int labels_n;

static int self(void) {
  if (self_id < 0) {
    int id = atomic_fetch_add_explicit(&next_tid, 1, memory_order_relaxed);
    self_id = id < THREADS_MAX ? id : THREADS_MAX - 1;
  }
  return self_id;
}

static entry *find(uintptr_t line) {
  uintptr_t key = line + 1;
  size_t h = (size_t)((line * 0x9E3779B97F4A7C15u) >> (64 - TABLE_BITS));
  for (size_t i = 0; i < PROBES; i++) {
    entry *e = &table[(h + i) & (TABLE_SIZE - 1)];
    /* Acquire: pairs with the claiming CAS below (a key, once seen, names
     * the entry for good; the counters need no ordering). */
    uintptr_t k = atomic_load_explicit(&e->key, memory_order_acquire);
    if (k == 0) {
      /* Claim the empty slot; a racing claimer for the same line wins
       * equally well, one for another line sends us on probing. */
      if (atomic_compare_exchange_strong_explicit(&e->key, &k, key, memory_order_acq_rel,
                                                  memory_order_acquire))
        return e;
    }
    if (k == key) return e;
  }
  return NULL;
}

static void bump(atomic_uint_fast64_t *c) {
  atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

static void set_bit(atomic_uint_fast64_t *map, uint64_t bit) {
  /* Read first: a thread's bit is set once, and the common case reads. */
  if (!(atomic_load_explicit(map, memory_order_relaxed) & bit))
    atomic_fetch_or_explicit(map, bit, memory_order_relaxed);
}

void tko__audit_note(const volatile void *p, enum tko__audit_kind kind) {
  int me = self();
  entry *e = find((uintptr_t)p >> LINE_SHIFT);
  if (!e) {
    bump(&overflow);
    return;
  }
  if (locked) {
    bump(&e->locked);
    atomic_store_explicit(&e->under, held + 1, memory_order_relaxed);
  }
  if (kind == TKO__AUDIT_LOAD) {
    bump(&e->loads);
    set_bit(&e->readers, (uint64_t)1 << me);
    int last = atomic_load_explicit(&e->last_writer, memory_order_relaxed);
    if (last && last != me + 1) bump(&e->foreign_loads);
    return;
  }
  bump(kind == TKO__AUDIT_RMW ? &e->rmws : &e->stores);
  atomic_fetch_add_explicit(&e->writes_by[me], 1, memory_order_relaxed);
  set_bit(&e->writers, (uint64_t)1 << me);
  int prev = atomic_exchange_explicit(&e->last_writer, me + 1, memory_order_relaxed);
  if (prev && prev != me + 1) bump(&e->handoffs);
}

void tko__audit_locked(const volatile void *p, int delta) {
  if (delta < 0) {
    if (locked > 0) locked--;
    return;
  }
  /* The acquiring exchange was recorded just before: count it too. */
  if (locked++ == 0) {
    entry *e = find((uintptr_t)p >> LINE_SHIFT);
    held = e ? (size_t)(e - table) : SIZE_MAX;
    if (e) {
      bump(&e->locked);
      atomic_store_explicit(&e->under, held + 1, memory_order_relaxed);
    }
  }
}

bool tko__audit_cas(const volatile void *p, bool succeeded) {
  tko__audit_note(p, TKO__AUDIT_RMW);
  if (!succeeded) {
    entry *e = find((uintptr_t)p >> LINE_SHIFT);
    if (e) bump(&e->cas_failed);
  }
  return succeeded;
}

void tko__audit_name_thread(const char *role) {
  atomic_store_explicit(&roles[self()], role, memory_order_relaxed);
}

unsigned tko__audit_count_role(uint64_t threads, const char *role) {
  unsigned n = 0;
  for (int id = 0; id < THREADS_MAX; id++) {
    const char *r = atomic_load_explicit(&roles[id], memory_order_relaxed);
    n += (threads >> id & 1) && r && !strcmp(r, role);
  }
  return n;
}

void tko__audit_label(const void *base, size_t size, const char *name) {
  int i = atomic_fetch_add_explicit(&labels_n, 1, memory_order_relaxed);
  if (i >= LABELS_MAX) return;
  labels[i].name = name;
  labels[i].base = (uintptr_t)base;
  labels[i].size = size;
}

void tko__audit_reset(void) {
  for (size_t i = 0; i < TABLE_SIZE; i++) {
    entry *e = &table[i];
    if (!atomic_load_explicit(&e->key, memory_order_relaxed)) continue;
    for (size_t t = 0; t < THREADS_MAX; t++)
      atomic_store_explicit(&e->writes_by[t], 0, memory_order_relaxed);
    atomic_uint_fast64_t *c[] = {&e->writers, &e->readers,    &e->loads,    &e->stores,
                                 &e->rmws,    &e->cas_failed, &e->handoffs, &e->foreign_loads};
    for (size_t j = 0; j < sizeof c / sizeof *c; j++)
      atomic_store_explicit(c[j], 0, memory_order_relaxed);
    atomic_store_explicit(&e->last_writer, 0, memory_order_relaxed);
    atomic_store_explicit(&e->locked, 0, memory_order_relaxed);
    atomic_store_explicit(&e->under, 0, memory_order_relaxed);
  }
  atomic_store_explicit(&overflow, 0, memory_order_relaxed);
}

static uint64_t get(atomic_uint_fast64_t *c) {
  return atomic_load_explicit(c, memory_order_relaxed);
}

/* True if the line is written and some thread other than a sole writer
 * touches it: the lines that can move between cores. */
static bool shared(const tko__audit_line *l) {
  return l->writers && ((l->writers & (l->writers - 1)) || (l->readers & ~l->writers));
}

static bool many_writers(const tko__audit_line *l) {
  return l->writers & (l->writers - 1);
}

static void read_entry(entry *e, uint64_t tasks, tko__audit_line *l) {
  *l = (tko__audit_line){.addr = (atomic_load_explicit(&e->key, memory_order_relaxed) - 1)
                                 << LINE_SHIFT,
                         .writers = get(&e->writers),
                         .readers = get(&e->readers),
                         .loads = get(&e->loads),
                         .stores = get(&e->stores),
                         .rmws = get(&e->rmws),
                         .cas_failed = get(&e->cas_failed),
                         .handoffs = get(&e->handoffs),
                         .foreign_loads = get(&e->foreign_loads),
                         .locked = get(&e->locked),
                         .under = atomic_load_explicit(&e->under, memory_order_relaxed)};
  uint64_t writes = l->stores + l->rmws, top = 0;
  for (size_t t = 0; t < THREADS_MAX; t++) {
    uint64_t w = atomic_load_explicit(&e->writes_by[t], memory_order_relaxed);
    if (w > top) top = w;
  }
  uint64_t bound = 2 * (writes - (top < writes ? top : writes)) + l->foreign_loads;
  uint64_t moves = shared(l) ? (writes < bound ? writes : bound) : 0;
  l->demand = tasks ? (double)moves / (double)tasks : 0;
}

/* Visits every line touched since the reset. */
static void each_line(uint64_t tasks, void (*fn)(const tko__audit_line *, void *), void *ctx) {
  for (size_t i = 0; i < TABLE_SIZE; i++) {
    /* Acquire: pairs with find's claiming CAS, as find's load does. */
    if (!atomic_load_explicit(&table[i].key, memory_order_acquire)) continue;
    tko__audit_line l;
    read_entry(&table[i], tasks, &l);
    if (l.writers | l.readers) fn(&l, ctx);
  }
}

typedef struct sums {
  tko__audit_summary *s;
  double *by_lock; /* serialised fetches per task, by the lock's entry index */
} sums;

static void sum_line(const tko__audit_line *l, void *ctx) {
  sums *u = ctx;
  tko__audit_summary *s = u->s;
  s->lines++;
  if (!shared(l)) return;
  s->lines_shared++;
  double t = s->tasks ? (double)s->tasks : 1;
  if (many_writers(l)) s->contended_rmws_per_task += (double)l->rmws / t;
  s->shared_stores_per_task += (double)l->stores / t;
  s->handoffs_per_task += (double)l->handoffs / t;
  if (l->demand > s->worst.demand) s->worst = *l;
  /* A lock's holder fetches a line at most once per write of it by anyone
   * (its own included: a bound, reached when the writes interleave finely,
   * as they do on many cores). Sections of one lock run one at a time, so
   * these add up per lock. */
  uint64_t writes = l->stores + l->rmws;
  if (l->under && l->under <= TABLE_SIZE)
    u->by_lock[l->under - 1] += (double)(l->locked < writes ? l->locked : writes) / t;
}

void tko__audit_summarize(uint64_t tasks, tko__audit_summary *out) {
  *out = (tko__audit_summary){.tasks = tasks};
  sums u = {.s = out, .by_lock = calloc(TABLE_SIZE, sizeof(double))};
  if (!u.by_lock) return;
  each_line(tasks, sum_line, &u);
  for (size_t i = 0; i < TABLE_SIZE; i++) {
    if (u.by_lock[i] <= out->serialised_per_task) continue;
    out->serialised_per_task = u.by_lock[i];
    out->worst_lock = (atomic_load_explicit(&table[i].key, memory_order_relaxed) - 1) << LINE_SHIFT;
  }
  free(u.by_lock);
  int n = atomic_load_explicit(&next_tid, memory_order_relaxed);
  out->threads = (uint64_t)(n < THREADS_MAX ? n : THREADS_MAX);
  out->overflow = get(&overflow);
}

/* "pool+0x40" for a line inside a labelled object, else its address; then
 * the labelled fields (labels of at most a line) it holds, in brackets. */
static void line_name(uintptr_t addr, char *buf, size_t len) {
  int n = atomic_load_explicit(&labels_n, memory_order_relaxed);
  size_t at = 0;
  bool region = false, field = false;
  for (int i = 0; i < n && i < LABELS_MAX; i++) {
    if (addr + (1 << LINE_SHIFT) <= labels[i].base || addr >= labels[i].base + labels[i].size ||
        labels[i].size <= (1 << LINE_SHIFT) || region)
      continue;
    long off = (long)(addr - labels[i].base); /* negative: the line starts before it */
    at += (size_t)snprintf(buf, len, "%s%s0x%lx", labels[i].name, off < 0 ? "-" : "+",
                           (unsigned long)(off < 0 ? -off : off));
    region = true;
  }
  if (!region) at += (size_t)snprintf(buf, len, "0x%lx", (unsigned long)addr);
  for (int i = 0; i < n && i < LABELS_MAX && at < len; i++) {
    if (addr + (1 << LINE_SHIFT) <= labels[i].base || addr >= labels[i].base + labels[i].size ||
        labels[i].size > (1 << LINE_SHIFT))
      continue;
    at += (size_t)snprintf(buf + at, len - at, "%s%s", field ? ", " : " [", labels[i].name);
    field = true;
  }
  if (field && at < len) snprintf(buf + at, len - at, "]");
}

/* "8 producer + 1 main": the threads in a bitmap, counted by role. */
static void roles_of(uint64_t map, char *buf, size_t len) {
  const char *names[THREADS_MAX];
  unsigned counts[THREADS_MAX], k = 0;
  for (int id = 0; id < THREADS_MAX; id++) {
    if (!(map >> id & 1)) continue;
    const char *r = atomic_load_explicit(&roles[id], memory_order_relaxed);
    if (!r) r = "thread";
    unsigned j = 0;
    while (j < k && strcmp(names[j], r))
      j++;
    if (j == k) names[k] = r, counts[k++] = 0;
    counts[j]++;
  }
  size_t at = 0;
  buf[0] = 0;
  for (unsigned j = 0; j < k && at < len; j++)
    at += (size_t)snprintf(buf + at, len - at, "%s%u %s", j ? " + " : "", counts[j], names[j]);
  if (!k) snprintf(buf, len, "-");
}

typedef struct collect {
  tko__audit_line *lines;
  size_t n, cap;
} collect;

static void collect_shared(const tko__audit_line *l, void *ctx) {
  collect *c = ctx;
  if (!shared(l) || c->n == c->cap) return;
  c->lines[c->n++] = *l;
}

static int by_demand(const void *a, const void *b) {
  double x = ((const tko__audit_line *)a)->demand, y = ((const tko__audit_line *)b)->demand;
  return (x < y) - (x > y);
}

void tko__audit_report(FILE *f, uint64_t tasks, unsigned top) {
  tko__audit_summary s;
  tko__audit_summarize(tasks, &s);
  double t = tasks ? (double)tasks : 1;
  char name[160];
  line_name(s.worst.addr, name, sizeof name);
  fprintf(f, "sharing audit: %llu tasks, %llu threads, %llu lines touched, %llu shared",
          (unsigned long long)tasks, (unsigned long long)s.threads, (unsigned long long)s.lines,
          (unsigned long long)s.lines_shared);
  if (s.overflow)
    fprintf(f, ", %llu accesses not recorded (table full)", (unsigned long long)s.overflow);
  fprintf(f,
          "\n  contended RMWs per task      %8.4f  (RMWs on lines two or more threads write)\n"
          "  shared-line stores per task  %8.4f  (stores to lines another thread reads)\n"
          "  worst line's demand per task %8.4f  (%s: transfers it needs per task, at most)\n",
          s.contended_rmws_per_task, s.shared_stores_per_task, s.worst.demand, name);
  line_name(s.worst_lock, name, sizeof name);
  fprintf(f,
          "  serialised fetches per task  %8.4f  (lines the holder of the lock at %s may "
          "fetch: its sections run one at a time)\n"
          "  observed hand-offs per task  %8.4f  (writes after another thread's write; "
          "depends on timing)\n",
          s.serialised_per_task, s.worst_lock ? name : "-", s.handoffs_per_task);
  collect c = {.lines = calloc(s.lines_shared ? s.lines_shared : 1, sizeof *c.lines),
               .cap = s.lines_shared};
  if (!c.lines) return;
  each_line(tasks, collect_shared, &c);
  qsort(c.lines, c.n, sizeof *c.lines, by_demand);
  fprintf(f, "\n| line | demand/task | RMW/task | CAS failed/task | store/task | load/task |"
             " under lock/task | hand-offs/task | writers | other readers |\n"
             "|:--|--:|--:|--:|--:|--:|--:|--:|:--|:--|\n");
  for (size_t i = 0; i < c.n && i < top; i++) {
    const tko__audit_line *l = &c.lines[i];
    char w[160], r[160];
    line_name(l->addr, name, sizeof name);
    roles_of(l->writers, w, sizeof w);
    roles_of(l->readers & ~l->writers, r, sizeof r);
    fprintf(f, "| %s | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %s | %s |\n", name,
            l->demand, (double)l->rmws / t, (double)l->cas_failed / t, (double)l->stores / t,
            (double)l->loads / t, (double)l->locked / t, (double)l->handoffs / t, w, r);
  }
  if (c.n > top) fprintf(f, "(%zu more shared lines)\n", c.n - top);
  free(c.lines);
}
