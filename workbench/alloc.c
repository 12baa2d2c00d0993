/* SPDX-License-Identifier: MIT */
/* Heap allocation counts, from jemalloc's statistics when the workbench is
 * built with it (TKO_HAVE_JEMALLOC; jemalloc then serves every malloc in the
 * process). Without it the summary says "n/a".
 *
 * The count is small + large allocation requests over all arenas. Requests
 * served from a thread's cache are merged into the arena counts only when
 * that cache is flushed, so callers read the final count after the pool's
 * threads have exited (their caches are flushed then), and this flushes the
 * calling thread's own cache before each reading. */
#include "wb.h"

#ifdef TKO_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>

static bool read_u64(const char *name, uint64_t *out) {
  size_t sz = sizeof *out;
  return mallctl(name, out, &sz, NULL, 0) == 0;
}

bool wb_allocs_read(uint64_t *total) {
  bool stats = false;
  size_t sz = sizeof stats;
  if (mallctl("config.stats", &stats, &sz, NULL, 0) != 0 || !stats) return false;
  mallctl("thread.tcache.flush", NULL, NULL, NULL, 0); /* fails harmlessly without a tcache */
  uint64_t epoch = 1;
  sz = sizeof epoch;
  if (mallctl("epoch", &epoch, &sz, &epoch, sz) != 0) return false; /* refreshes the stats */
  char name[64];
  uint64_t small = 0, large = 0;
  snprintf(name, sizeof name, "stats.arenas.%d.small.nrequests", MALLCTL_ARENAS_ALL);
  if (!read_u64(name, &small)) return false;
  snprintf(name, sizeof name, "stats.arenas.%d.large.nrequests", MALLCTL_ARENAS_ALL);
  if (!read_u64(name, &large)) return false;
  *total = small + large;
  return true;
}

const char *wb_allocs_source(void) {
  return "jemalloc";
}

#else

bool wb_allocs_read(uint64_t *total) {
  (void)total;
  return false;
}

const char *wb_allocs_source(void) {
  return "none";
}

#endif
