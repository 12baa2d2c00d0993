/* SPDX-License-Identifier: MIT */
/* One indexed binary heap, the queue's (its weight buckets, best first)
 * and the timers' (earliest deadline first). Each element records its
 * position, so that any element can be removed and re-placed in O(log n).
 *
 * TKO__HEAP_DEFINE(name, ctx_t, elem_t, AT, PLACE, BEFORE, LEN) writes
 * three static functions over a heap reached through a ctx_t pointer:
 *   name_sift_up(c, pos)    moves the element at pos towards the root
 *   name_sift_down(c, pos)  moves it towards the leaves; returns where it ends
 *   name_remove_at(c, pos)  takes out the element at pos (LEN shrinks by one)
 * with AT(c, pos) the element at pos, PLACE(c, pos, e) storing e at pos and
 * recording pos in it, BEFORE(c, a, b) true when a must come out before b,
 * and LEN(c) the element count as an lvalue. A macro rather than callbacks:
 * the queue's heap is on the take path (bench_peers' empty tasks), and each
 * instance compiles to the hand-written loops it replaced. */
#ifndef TKO_HEAP_H
#define TKO_HEAP_H

#include <stdint.h>

#define TKO__HEAP_DEFINE(name, ctx_t, elem_t, AT, PLACE, BEFORE, LEN)                  \
  static __attribute__((unused)) void name##_sift_up(ctx_t *c, uint32_t pos) {         \
    elem_t e = AT(c, pos);                                                             \
    while (pos > 0) {                                                                  \
      uint32_t parent = (pos - 1) / 2;                                                 \
      if (!BEFORE(c, e, AT(c, parent))) break;                                         \
      PLACE(c, pos, AT(c, parent));                                                    \
      pos = parent;                                                                    \
    }                                                                                  \
    PLACE(c, pos, e);                                                                  \
  }                                                                                    \
  static __attribute__((unused)) uint32_t name##_sift_down(ctx_t *c, uint32_t pos) {   \
    elem_t e = AT(c, pos);                                                             \
    for (;;) {                                                                         \
      uint32_t child = 2 * pos + 1;                                                    \
      if (child >= LEN(c)) break;                                                      \
      if (child + 1 < LEN(c) && BEFORE(c, AT(c, child + 1), AT(c, child))) child++;   \
      if (!BEFORE(c, AT(c, child), e)) break;                                          \
      PLACE(c, pos, AT(c, child));                                                     \
      pos = child;                                                                     \
    }                                                                                  \
    PLACE(c, pos, e);                                                                  \
    return pos;                                                                        \
  }                                                                                    \
  /* The last element fills the hole, then goes down or up, whichever its    \
   * order asks (after a move down, the way up stops at once). */           \
  static __attribute__((unused)) void name##_remove_at(ctx_t *c, uint32_t pos) {       \
    uint32_t last = --LEN(c);                                                          \
    if (pos == last) return;                                                           \
    PLACE(c, pos, AT(c, last));                                                        \
    name##_sift_up(c, name##_sift_down(c, pos));                                       \
  }

#endif
