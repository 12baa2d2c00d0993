/* SPDX-License-Identifier: MIT */
/* The pool's allocator: the caller's tko_allocator or the C library's. Only
 * create, growth and destroy paths allocate; nothing here runs per task. */
#ifndef TKO_MEM_H
#define TKO_MEM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "prim.h"
#include "taskorch.h"

/* An allocator gives all three functions or none: memory from the host's
 * alloc must not reach the C library's realloc or free, nor the reverse. */
static inline bool tko__allocator_valid(const tko_allocator *a) {
  if (!a) return true;
  int set = (a->alloc != NULL) + (a->realloc != NULL) + (a->free != NULL);
  return set == 0 || set == 3;
}

static inline void *tko__mem_alloc(const tko_allocator *a, size_t size) {
  return a && a->alloc ? a->alloc(a->ctx, size) : malloc(size);
}

/* size bytes aligned to align (a power of two: a cache line, so that what
 * one thread writes shares no line with its neighbours), from the pool's
 * allocator, which need not align that far; *raw is what to free. */
static inline void *tko__mem_alloc_aligned(const tko_allocator *a, size_t size, size_t align,
                                           void **raw) {
  *raw = tko__mem_alloc(a, size + align);
  if (!*raw) return NULL;
  return (void *)(((uintptr_t)*raw + align - 1) & ~(uintptr_t)(align - 1));
}

static inline void *tko__mem_realloc(const tko_allocator *a, void *p, size_t size) {
  return a && a->realloc ? a->realloc(a->ctx, p, size) : realloc(p, size);
}

static inline void tko__mem_free(const tko_allocator *a, void *p) {
  if (a && a->free)
    a->free(a->ctx, p);
  else
    free(p);
}

/* Growable arrays (the queue's slab): through the caller's realloc if it
 * gave one; otherwise malloc'd while small and, from TKO__MAP_MIN bytes on,
 * a huge-page mapping of their own that grows without copying (prim.h).
 * Which one an array is follows from its size, so nothing records it. */
static inline bool tko__mem_mapped(const tko_allocator *a, size_t bytes) {
  return !(a && a->realloc) && bytes >= TKO__MAP_MIN;
}

static inline void *tko__mem_array_alloc(const tko_allocator *a, size_t bytes) {
  return tko__mem_mapped(a, bytes) ? tko__map_alloc(bytes) : tko__mem_alloc(a, bytes);
}

/* NULL, with p untouched, if there is no memory. */
static inline void *tko__mem_array_grow(const tko_allocator *a, void *p, size_t old_bytes,
                                        size_t new_bytes) {
  if (!tko__mem_mapped(a, new_bytes)) return tko__mem_realloc(a, p, new_bytes);
  if (tko__mem_mapped(a, old_bytes)) return tko__map_grow(p, old_bytes, new_bytes);
  void *n = tko__map_alloc(new_bytes);
  if (!n) return NULL;
  memcpy(n, p, old_bytes);
  tko__mem_free(a, p);
  return n;
}

static inline void tko__mem_array_free(const tko_allocator *a, void *p, size_t bytes) {
  if (tko__mem_mapped(a, bytes)) tko__map_free(p, bytes);
  else tko__mem_free(a, p);
}

#endif
