/* SPDX-License-Identifier: MIT */
/* Order-named wrappers around C11 atomics, so that every memory ordering in
 * the library can be found with grep (after mimalloc's mi_atomic_*). Each use
 * that is not seq_cst carries a comment saying what it pairs with. */
#ifndef TKO_ATOMICS_H
#define TKO_ATOMICS_H

#include <stdatomic.h>

#define tko__load_relaxed(p) atomic_load_explicit((p), memory_order_relaxed)
#define tko__load_acquire(p) atomic_load_explicit((p), memory_order_acquire)
#define tko__load_seq(p) atomic_load_explicit((p), memory_order_seq_cst)
#define tko__store_relaxed(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define tko__store_release(p, v) atomic_store_explicit((p), (v), memory_order_release)
#define tko__store_seq(p, v) atomic_store_explicit((p), (v), memory_order_seq_cst)
#define tko__add_relaxed(p, v) atomic_fetch_add_explicit((p), (v), memory_order_relaxed)
#define tko__add_seq(p, v) atomic_fetch_add_explicit((p), (v), memory_order_seq_cst)
#define tko__sub_relaxed(p, v) atomic_fetch_sub_explicit((p), (v), memory_order_relaxed)
#define tko__sub_seq(p, v) atomic_fetch_sub_explicit((p), (v), memory_order_seq_cst)
#define tko__exchange_seq(p, v) atomic_exchange_explicit((p), (v), memory_order_seq_cst)
#define tko__cas_seq(p, expected, desired) \
  atomic_compare_exchange_weak_explicit((p), (expected), (desired), \
                                        memory_order_seq_cst, memory_order_relaxed)

/* Asks for a cache line in exclusive state ahead of a read-modify-write:
 * reading a line another core wrote and then writing it costs two
 * transfers (shared, then the upgrade); this makes it one. x86's
 * PREFETCHW (a no-op on cores without it); elsewhere the compiler's write
 * prefetch. A hint: no ordering. */
static inline void tko__prefetch_for_write(const volatile void *p) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__ __volatile__("prefetchw (%0)" : : "r"(p));
#else
  __builtin_prefetch((const void *)p, 1);
#endif
}

/* Keeps hot counters that different threads write on separate cache lines. */
#define TKO_CACHE_LINE 64
#define TKO_CACHE_ALIGNED _Alignas(TKO_CACHE_LINE)

#endif
