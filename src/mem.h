/* The pool's allocator: the caller's tko_allocator or the C library's. Only
 * create, growth and destroy paths allocate; nothing here runs per task. */
#ifndef TKO_MEM_H
#define TKO_MEM_H

#include <stdlib.h>

#include "taskorch.h"

static inline void *tko__mem_alloc(const tko_allocator *a, size_t size) {
  return a && a->alloc ? a->alloc(a->ctx, size) : malloc(size);
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

#endif
