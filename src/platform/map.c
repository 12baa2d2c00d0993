/* SPDX-License-Identifier: MIT */
/* Big growable mappings (prim.h): huge-page aligned anonymous memory that
 * grows with mremap rather than by copying (the queue's slab), with a
 * malloc fallback where mremap does not exist. */
#define _GNU_SOURCE
#include "prim.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <sys/mman.h>
#define TKO_HAVE_MREMAP 1
#endif

size_t tko__map_size(size_t bytes) { return (bytes + TKO__MAP_ALIGN - 1) & ~(TKO__MAP_ALIGN - 1); }

#ifdef TKO_HAVE_MREMAP
/* Maps one huge page more than asked and trims both ends, so the mapping
 * starts on a huge-page boundary (THP only backs aligned 2 MiB spans). */
void *tko__map_alloc(size_t bytes) {
  size_t len = tko__map_size(bytes), span = len + TKO__MAP_ALIGN;
  char *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  char *start = (char *)(((uintptr_t)p + TKO__MAP_ALIGN - 1) & ~(uintptr_t)(TKO__MAP_ALIGN - 1));
  if (start > p) munmap(p, (size_t)(start - p));
  size_t after = (size_t)(p + span - (start + len));
  if (after) munmap(start + len, after);
  /* Advice only: where THP is off, this is plain 4 KiB memory. */
  (void)madvise(start, len, MADV_HUGEPAGE);
  return start;
}

void *tko__map_grow(void *p, size_t old_bytes, size_t new_bytes) {
  size_t old_len = tko__map_size(old_bytes), new_len = tko__map_size(new_bytes);
  if (new_len == old_len) return p;
  /* An aligned place for the grown slab; then move the old mapping there
   * and grow it in the same call: page tables move, the bytes stay where
   * they are in memory and nothing faults again. Moving and growing at
   * once keeps the slab one mapping (VMA): moving only the old part into
   * a fresh mapping left two that the kernel does not merge, and kernels
   * before 6.17 refuse to move a range across mappings - the next growth
   * would have failed after the destination was already unmapped. */
  void *n = tko__map_alloc(new_bytes);
  if (!n) return NULL;
  if (mremap(p, old_len, new_len, MREMAP_MAYMOVE | MREMAP_FIXED, n) != MAP_FAILED) {
    (void)madvise(n, new_len, MADV_HUGEPAGE); /* the grown part, to be sure */
    return n;
  }
  /* The move failed; the destination may be unmapped by now, the source is
   * untouched: copy into a mapping of its own. */
  munmap(n, new_len);
  n = tko__map_alloc(new_bytes);
  if (!n) return NULL;
  memcpy(n, p, old_bytes);
  munmap(p, old_len);
  return n;
}

void tko__map_free(void *p, size_t bytes) {
  if (p) munmap(p, tko__map_size(bytes));
}
#else
void *tko__map_alloc(size_t bytes) { return malloc(bytes); }
void *tko__map_grow(void *p, size_t old_bytes, size_t new_bytes) {
  (void)old_bytes;
  return realloc(p, new_bytes);
}
void tko__map_free(void *p, size_t bytes) {
  (void)bytes;
  free(p);
}
#endif
