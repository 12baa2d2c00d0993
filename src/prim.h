/* Platform primitives behind one small header (after mimalloc's prim.h):
 * a monotonic clock, a one-word futex-style wait/wake, thread naming, the CPU
 * count. Linux uses futex(2); elsewhere a portable pthread
 * fallback in prim.c stands in. */
#ifndef TKO_PRIM_H
#define TKO_PRIM_H

#include <stdatomic.h>
#include <stdint.h>

/* Monotonic time in nanoseconds. */
uint64_t tko__now_ns(void);

struct timespec;
/* An absolute CLOCK_MONOTONIC deadline ms from now, for timed waits on
 * condition variables created with that clock. */
void tko__deadline_after(struct timespec *ts, long ms);

#if defined(__linux__) && !defined(TKO_NO_FUTEX)
#define TKO_HAVE_FUTEX 1
/* Blocks while *word == expected, until woken, or until timeout_ns passes
 * (UINT64_MAX = no limit). May return spuriously: callers re-check the word. */
void tko__futex_wait(atomic_uint *word, unsigned expected, uint64_t timeout_ns);
/* Wakes up to one thread blocked in tko__futex_wait on word. */
void tko__futex_wake_one(atomic_uint *word);
#endif

/* Names the calling thread (truncated to the platform's limit). */
void tko__thread_set_name(const char *name);

/* fork() detection: the generation goes up in every child. The first call
 * to tko__fork_watch registers the atfork handler (once per process). */
void tko__fork_watch(void);
unsigned tko__fork_generation(void);

/* Test seam: when set, thread creation fails with this errno (tests of
 * thread-creation failure; never set by the library itself). */
extern _Atomic int tko__test_thread_create_errno;

/* The calling thread's nice value (Linux: per thread; elsewhere 0), and a
 * best-effort set of it: raising priority back needs CAP_SYS_NICE, so a
 * failure is ignored. */
int tko__thread_nice(void);
void tko__thread_set_nice(int nice);

/* Online CPU count, at least 1. */
unsigned tko__cpu_count(void);

#endif
