/* SPDX-License-Identifier: MIT */
/* The scenarios (each one a set of defaults for wb_config) and the task mix
 * they generate: a fixed seed gives the same mix, bit for bit, on every
 * machine, and wb_mix_generate returns a checksum of it to prove so. */
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "wb.h"

#define POOL_DEFAULTS(kind, w, max, idle) .pool = (kind), .workers = (w), .max_elastic = (max), \
                                          .idle_ms = (idle)

/* workers 0 means "CPU count" in these defaults; tail_ms -1 means "auto". */
static const wb_scenario scenarios[] = {
    {"demo",
     "a short tour: 4 floods of blocking and CPU tasks over weights 0..3 on an "
     "elastic pool; high weights wait least, elastic workers grow and retire",
     false,
     {POOL_DEFAULTS(WB_POOL_ELASTIC, 2, 6, 200), .tasks = 1600, .producers = 1,
      .weights = {0, 3}, .task_us = 200, .io_ms = 5, .io_pct = 50, .fail_pct = 0.5,
      .bursts = 4, .gap_ms = 400, .tail_ms = -1, .seed = 42}},
    {"cpu",
     "CPU-bound tasks on a basic pool of one worker per CPU, all queued at once",
     false,
     {POOL_DEFAULTS(WB_POOL_BASIC, 0, 0, 1000), .tasks = 20000, .producers = 1,
      .weights = {0, 3}, .task_us = 50, .io_ms = 0, .io_pct = 0, .fail_pct = 0,
      .bursts = 1, .gap_ms = 0, .tail_ms = -1, .seed = 42}},
    {"io",
     "blocking tasks (sleeps) on an elastic pool that grows to cover them",
     false,
     {POOL_DEFAULTS(WB_POOL_ELASTIC, 2, 30, 300), .tasks = 4000, .producers = 1,
      .weights = {0, 3}, .task_us = 0, .io_ms = 2, .io_pct = 100, .fail_pct = 0,
      .bursts = 1, .gap_ms = 0, .tail_ms = -1, .seed = 42}},
    {"mixed",
     "70% CPU and 30% blocking tasks over weights 0..7, 1% failing, elastic pool",
     false,
     {POOL_DEFAULTS(WB_POOL_ELASTIC, 2, 8, 300), .tasks = 5000, .producers = 1,
      .weights = {0, 7}, .task_us = 100, .io_ms = 2, .io_pct = 30, .fail_pct = 1,
      .bursts = 1, .gap_ms = 0, .tail_ms = -1, .seed = 42}},
    {"concurrent",
     "4 producers submitting empty tasks at once: the cost of concurrent enqueue",
     false,
     {POOL_DEFAULTS(WB_POOL_BASIC, 0, 0, 1000), .tasks = 200000, .producers = 4,
      .weights = {0, 7}, .task_us = 0, .io_ms = 0, .io_pct = 0, .fail_pct = 0,
      .bursts = 1, .gap_ms = 0, .tail_ms = -1, .seed = 42}},
    {"stress",
     "4 producers, 20 floods of tiny tasks over weights -1000..1000 with a few "
     "blocking and failing ones; elastic workers churn between floods",
     false,
     {POOL_DEFAULTS(WB_POOL_ELASTIC, 2, 6, 30), .tasks = 200000, .producers = 4,
      .weights = {-1000, 1000}, .task_us = 1, .io_ms = 1, .io_pct = 0.5,
      .fail_pct = 0.1, .bursts = 20, .gap_ms = 50, .tail_ms = -1, .seed = 42}},
    {"burst",
     "idle, then one flood of mostly blocking tasks, then idle: elastic "
     "workers grow for the flood and retire after it",
     true,
     {POOL_DEFAULTS(WB_POOL_ELASTIC, 2, 8, 200), .tasks = 2000, .producers = 1,
      .weights = {0, 3}, .task_us = 100, .io_ms = 3, .io_pct = 70, .fail_pct = 0,
      .bursts = 1, .gap_ms = 300, .tail_ms = -1, .seed = 42}},
    {"resize",
     "4 floods of CPU and blocking tasks on a pool of one worker, resized to 4 basic "
     "+ up to 4 elastic workers before the third (tko_pool_resize): the floods after "
     "it run on more workers",
     false,
     {POOL_DEFAULTS(WB_POOL_ELASTIC, 1, 0, 200), .tasks = 1200, .producers = 1,
      .weights = {0, 3}, .task_us = 200, .io_ms = 2, .io_pct = 30, .fail_pct = 0,
      .bursts = 4, .gap_ms = 100, .tail_ms = -1, .seed = 42, .resize = {true, 4, 4}}},
};
#define NSCENARIOS (sizeof scenarios / sizeof scenarios[0])

const wb_scenario *wb_scenario_find(const char *name) {
  for (size_t i = 0; i < NSCENARIOS; i++)
    if (!strcmp(scenarios[i].name, name)) return &scenarios[i];
  return NULL;
}

const wb_scenario *wb_scenario_at(size_t i) {
  return i < NSCENARIOS ? &scenarios[i] : NULL;
}

unsigned wb_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1u : n > (long)TKO_MAX_WORKERS ? TKO_MAX_WORKERS : (unsigned)n;
}

void wb_config_describe(FILE *f, const wb_config *c, const char *indent) {
  if (c->pool == WB_POOL_BASIC) {
    if (c->workers)
      fprintf(f, "%spool: basic, %u workers\n", indent, c->workers);
    else
      fprintf(f, "%spool: basic, one worker per CPU\n", indent);
  } else {
    fprintf(f, "%spool: elastic, %u basic + up to %u elastic workers, idle timeout %u ms\n",
            indent, c->workers, c->max_elastic, c->idle_ms);
  }
  fprintf(f, "%sload: %" PRIu64 " tasks, %u producer%s, weights %d:%d\n", indent, c->tasks,
          c->producers, c->producers == 1 ? "" : "s", c->weights.lo, c->weights.hi);
  fprintf(f, "%stasks: ", indent);
  if (c->io_pct > 0) fprintf(f, "%g%% blocking ~%u ms%s", c->io_pct, c->io_ms,
                             c->io_pct < 100 ? ", the rest " : "");
  if (c->io_pct < 100) {
    if (c->task_us)
      fprintf(f, "CPU work ~%u us", c->task_us);
    else
      fprintf(f, "empty");
  }
  if (c->fail_pct > 0) fprintf(f, ", %g%% failing", c->fail_pct);
  fputc('\n', f);
  fprintf(f, "%sarrival: %u flood%s", indent, c->bursts, c->bursts == 1 ? "" : "s");
  if (c->bursts > 1 || c->scenario->lead_idle)
    fprintf(f, ", %s%u ms of idle before %s", c->scenario->lead_idle ? "" : "after the first, ",
            c->gap_ms, c->bursts == 1 ? "it" : "each");
  fprintf(f, "; seed %" PRIu64 "\n", c->seed);
  /* The pool features, on one line, only when some are on. */
  char buf[256];
  size_t n = 0;
#define ADD(...) n += (size_t)snprintf(buf + n, n < sizeof buf ? sizeof buf - n : 0, __VA_ARGS__)
  if (c->groups) ADD(", groups of %u", c->groups);
  if (c->handles) ADD(", handles %u at a time", c->handles);
  if (c->cancel_pct > 0) ADD(", cancelling %g%%", c->cancel_pct);
  if (c->batch) ADD(", batches of %u", c->batch);
  if (c->delay_ms) ADD(", every task delayed %u ms", c->delay_ms);
  if (c->capacity) ADD(", queue bounded to %" PRIu64 " (%s when full)", c->capacity,
                       wb_full_name(c->full));
  if (c->aging_ms) ADD(", aging 1 weight per %u ms", c->aging_ms);
  if (c->blocking_hint) ADD(", blocking hint");
  if (c->async) ADD(", blocking tasks async");
  if (c->max_async) ADD(" (at most %u in flight)", c->max_async);
  if (c->resize.on)
    ADD(", resized to %u basic + up to %u elastic halfway", c->resize.basic,
        c->resize.max_elastic);
#undef ADD
  if (n) fprintf(f, "%sfeatures: %s\n", indent, buf + 2);
}

const char *wb_full_name(tko_full_policy p) {
  switch (p) {
    case TKO_FULL_BLOCK: return "block";
    case TKO_FULL_REJECT: return "reject";
    case TKO_FULL_CALLER_RUNS: return "caller";
  }
  return "?";
}

/* Prints text word-wrapped to 78 columns, each line after indent. */
static void print_wrapped(FILE *f, const char *indent, const char *text) {
  size_t width = 78 - strlen(indent), col = 0;
  while (*text) {
    size_t word = strcspn(text, " ");
    if (col && col + 1 + word > width) {
      fputc('\n', f);
      col = 0;
    }
    fprintf(f, "%s%.*s", col ? " " : indent, (int)word, text);
    col += (col ? 1 : 0) + word;
    text += word;
    text += strspn(text, " ");
  }
  fputc('\n', f);
}

void wb_scenario_describe(FILE *f, const wb_scenario *s) {
  fprintf(f, "%s\n", s->name);
  print_wrapped(f, "  ", s->about);
  wb_config c = s->defaults;
  c.scenario = s;
  wb_config_describe(f, &c, "  ");
}

/* splitmix64 (Steele, Lea, Flood): tiny, fast, and the same everywhere. */
static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static double unit(uint64_t r) {
  return (double)(r >> 11) * 0x1.0p-53;
}

/* A value spread uniformly over [base/2, base*3/2]. */
static uint32_t vary(uint64_t r, uint64_t base) {
  return base ? (uint32_t)(base / 2 + r % (base + 1)) : 0;
}

/* FNV-1a over the bytes of a value, little-endian whatever the host. */
static uint64_t fnv(uint64_t h, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= UINT64_C(0x100000001b3);
  }
  return h;
}

uint64_t wb_mix_generate(const wb_config *cfg, wb_task *out) {
  uint64_t state = cfg->seed;
  /* The cancel draws have a stream of their own, drawn only with
   * --cancel-pct, so the mix and its checksum are unchanged without it. */
  uint64_t cancel_state = cfg->seed ^ UINT64_C(0x63616e63656c6c73);
  uint64_t span = (uint64_t)((int64_t)cfg->weights.hi - cfg->weights.lo) + 1;
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (uint64_t i = 0; i < cfg->tasks; i++) {
    /* Four draws per task, always, so that one setting never shifts the
     * random stream of the others. */
    uint64_t rw = splitmix64(&state), rk = splitmix64(&state);
    uint64_t rt = splitmix64(&state), rf = splitmix64(&state);
    wb_task *t = &out[i];
    t->weight = (int32_t)((int64_t)cfg->weights.lo + (int64_t)(rw % span));
    t->kind = unit(rk) * 100.0 < cfg->io_pct ? WB_TASK_IO : WB_TASK_CPU;
    t->work_us = vary(rt, t->kind == WB_TASK_IO ? (uint64_t)cfg->io_ms * 1000 : cfg->task_us);
    t->fail = unit(rf) * 100.0 < cfg->fail_pct;
    t->cancel = cfg->cancel_pct > 0 && unit(splitmix64(&cancel_state)) * 100.0 < cfg->cancel_pct;
    h = fnv(h, (uint32_t)t->weight, 4);
    h = fnv(h, t->work_us, 4);
    h = fnv(h, t->kind, 1);
    h = fnv(h, t->fail, 1);
    if (cfg->cancel_pct > 0) h = fnv(h, t->cancel, 1);
  }
  return h;
}
