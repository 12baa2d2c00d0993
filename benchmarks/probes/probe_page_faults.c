/* SPDX-License-Identifier: MIT */
/* What a first touch of fresh memory costs: 48 MiB (a million queued tasks'
 * worth of slab) touched page by page, malloc'd, then as a 2 MiB-aligned
 * mapping advised for transparent huge pages. Three rounds of each.
 *   probe_page_faults            */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "probe_common.h"

enum { MIB = 1 << 20, HUGE = 2 * MIB, BYTES = 48 * MIB };

static double touch(volatile char *p) {
  uint64_t t0 = probe_now_ns();
  for (size_t i = 0; i < BYTES; i += 4096) p[i] = 1;
  return (double)(probe_now_ns() - t0) / 1e6;
}

int main(void) {
  for (int r = 0; r < 3; r++) {
    char *p = malloc(BYTES);
    if (!p) return 1;
    double ms = touch(p);
    printf("malloc, 4 KiB pages: %.1f ms (%.2f us a page)\n", ms, ms * 1e3 / (BYTES / 4096));
    free(p);
  }
  for (int r = 0; r < 3; r++) {
    char *m = mmap(NULL, BYTES + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 1;
    char *p = (char *)(((uintptr_t)m + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    madvise(p, BYTES, MADV_HUGEPAGE);
    printf("mapping, MADV_HUGEPAGE: %.1f ms\n", touch(p));
    munmap(m, BYTES + HUGE);
  }
  return 0;
}
