/* SPDX-License-Identifier: MIT */
/* Order-named wrappers around C11 atomics, so that every memory ordering in
 * the library can be found with grep (after mimalloc's mi_atomic_*). Each use
 * that is not seq_cst carries a comment saying what it pairs with. */
#ifndef TKO_ATOMICS_H
#define TKO_ATOMICS_H

#include <stdatomic.h>

/* The sharing audit (audit.h, -DTKO_SHARING_AUDIT=ON) records each access
 * against its cache line before making it; without the option a wrapper is
 * the bare atomic, at no cost. p is evaluated twice in the audit build. */
#ifdef TKO_SHARING_AUDIT
#include "audit.h"
#define TKO__AUDITED(kind, p, op) \
  (tko__audit_note((const volatile void *)(p), TKO__AUDIT_##kind), (op))
#define TKO__AUDITED_CAS(p, op) tko__audit_cas((const volatile void *)(p), (op))
#define TKO__AUDIT_LOCKED(p, delta) tko__audit_locked((const volatile void *)(p), (delta))
/* A plain access the audit should see as one (a ring slot's payload). */
#define TKO__AUDIT_PLAIN(kind, p) tko__audit_note((const volatile void *)(p), TKO__AUDIT_##kind)
#else
#define TKO__AUDITED(kind, p, op) (op)
#define TKO__AUDITED_CAS(p, op) (op)
#define TKO__AUDIT_LOCKED(p, delta) ((void)0)
#define TKO__AUDIT_PLAIN(kind, p) ((void)0)
#endif

#define tko__load_relaxed(p) TKO__AUDITED(LOAD, p, atomic_load_explicit((p), memory_order_relaxed))
#define tko__load_acquire(p) TKO__AUDITED(LOAD, p, atomic_load_explicit((p), memory_order_acquire))
#define tko__load_seq(p) TKO__AUDITED(LOAD, p, atomic_load_explicit((p), memory_order_seq_cst))
#define tko__store_relaxed(p, v) \
  TKO__AUDITED(STORE, p, atomic_store_explicit((p), (v), memory_order_relaxed))
#define tko__store_release(p, v) \
  TKO__AUDITED(STORE, p, atomic_store_explicit((p), (v), memory_order_release))
#define tko__store_seq(p, v) \
  TKO__AUDITED(STORE, p, atomic_store_explicit((p), (v), memory_order_seq_cst))
#define tko__add_relaxed(p, v) \
  TKO__AUDITED(RMW, p, atomic_fetch_add_explicit((p), (v), memory_order_relaxed))
#define tko__add_seq(p, v) \
  TKO__AUDITED(RMW, p, atomic_fetch_add_explicit((p), (v), memory_order_seq_cst))
#define tko__sub_relaxed(p, v) \
  TKO__AUDITED(RMW, p, atomic_fetch_sub_explicit((p), (v), memory_order_relaxed))
#define tko__sub_seq(p, v) \
  TKO__AUDITED(RMW, p, atomic_fetch_sub_explicit((p), (v), memory_order_seq_cst))
#define tko__or_seq(p, v) \
  TKO__AUDITED(RMW, p, atomic_fetch_or_explicit((p), (v), memory_order_seq_cst))
#define tko__and_seq(p, v) \
  TKO__AUDITED(RMW, p, atomic_fetch_and_explicit((p), (v), memory_order_seq_cst))
#define tko__exchange_seq(p, v) \
  TKO__AUDITED(RMW, p, atomic_exchange_explicit((p), (v), memory_order_seq_cst))
#define tko__exchange_acquire(p, v) \
  TKO__AUDITED(RMW, p, atomic_exchange_explicit((p), (v), memory_order_acquire))
#define tko__exchange_acq_rel(p, v) \
  TKO__AUDITED(RMW, p, atomic_exchange_explicit((p), (v), memory_order_acq_rel))
#define tko__cas_acq_rel(p, expected, desired) \
  TKO__AUDITED_CAS(p, atomic_compare_exchange_weak_explicit((p), (expected), (desired), \
                                                            memory_order_acq_rel, \
                                                            memory_order_relaxed))
#define tko__cas_seq(p, expected, desired) \
  TKO__AUDITED_CAS(p, atomic_compare_exchange_weak_explicit((p), (expected), (desired), \
                                                            memory_order_seq_cst, \
                                                            memory_order_relaxed))

#define tko__cas_relaxed(p, expected, desired) \
  TKO__AUDITED_CAS(p, atomic_compare_exchange_weak_explicit((p), (expected), (desired), \
                                                            memory_order_relaxed, \
                                                            memory_order_relaxed))

/* A record's payload fields (a ring slot's): relaxed, because a reader may
 * load them while their owner rewrites them (ring.h: the stage, which then
 * finds its copy stale and drops it); the audit counts the record once,
 * with TKO__AUDIT_PLAIN, not each field. Plain moves on x86. */
#define tko__load_payload(p) atomic_load_explicit((p), memory_order_relaxed)
#define tko__store_payload(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)

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
