/* SPDX-License-Identifier: MIT */
/* Platform primitives behind one small header (after mimalloc's prim.h),
 * one source file per concept: futex.c (the monotonic clock, timed waits,
 * the one-word futex-style wait/wake), thread.c (starting, placing and
 * naming threads, nice values, the CPU count, fork detection), map.c (big
 * growable mappings), fd.c (readiness descriptors for event loops). Linux
 * uses futex(2), mremap and eventfd; elsewhere portable fallbacks in the
 * same files stand in. */
#ifndef TKO_PRIM_H
#define TKO_PRIM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "taskorch.h"
#include "witness.h"

/* splitmix64's finalizer: spreads sequential keys over unrelated values
 * (lane and coalescer hash tables). */
static inline uint64_t tko__mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

/* Clock and waits: futex.c. */

/* Monotonic time in nanoseconds. */
uint64_t tko__now_ns(void);

struct timespec;
/* An absolute CLOCK_MONOTONIC deadline ms from now, for timed waits on
 * condition variables created with that clock. */
void tko__deadline_after(struct timespec *ts, long ms);
/* Whether time a comes before time b (same clock). */
bool tko__time_before(const struct timespec *a, const struct timespec *b);

/* Waits on cv (caller holds mu: witness.h) until done(ctx)
 * holds or the deadline passes (NULL = no limit; a deadline already past
 * just checks): 0 once done, -ETIMEDOUT if the deadline passed first. The
 * one timed-wait loop: done is re-checked after every wake-up, spurious
 * ones included, and once more after the timeout, so a condition that
 * came true at the last moment is not reported as a timeout. */
int tko__cond_wait_until(pthread_cond_t *cv, tko__mutex *mu, const struct timespec *deadline,
                         bool (*done)(void *ctx), void *ctx);

#if defined(__linux__) && !defined(TKO_NO_FUTEX)
#define TKO_HAVE_FUTEX 1
/* Blocks while *word == expected, until woken, or until timeout_ns passes
 * (UINT64_MAX = no limit). May return spuriously: callers re-check the word. */
void tko__futex_wait(atomic_uint *word, unsigned expected, uint64_t timeout_ns);
/* Wakes up to one thread blocked in tko__futex_wait on word. */
void tko__futex_wake_one(atomic_uint *word);
#endif

/* Waiting for a word that another thread changes once, after which the
 * word's owner may free it at any time (a task handle's state: handle.c).
 * tko__word_wait blocks while *word == expected, until a tko__word_wake_all
 * of word or until timeout_ns passes (UINT64_MAX = no limit); it may return
 * spuriously, so callers re-check the word. tko__word_wake_all wakes every
 * thread blocked there, and reads and writes nothing at word: it may come
 * after the word was freed. On Linux both are futex calls (a wake on an
 * address that holds no futex is a no-op); elsewhere a process-wide table
 * of mutex and condition pairs, picked by the word's address, stands in:
 * the waiter re-checks the word under its pair's mutex, and the waker,
 * having changed the word first, broadcasts under that mutex, so no wake
 * falls between a waiter's check and its sleep. */
void tko__word_wait(atomic_uint *word, unsigned expected, uint64_t timeout_ns);
void tko__word_wake_all(atomic_uint *word);

/* Threads: thread.c. */

#define TKO__CPU_WORDS (TKO_MAX_CPUS / 64)

/* Names the calling thread (truncated to the platform's limit). */
void tko__thread_set_name(const char *name);

/* fork() detection: the generation goes up in every child. The first call
 * to tko__fork_watch registers the atfork handler (once per process). */
void tko__fork_watch(void);
unsigned tko__fork_generation(void);

/* Test seam: when set, thread creation fails with this errno (tests of
 * thread-creation failure; never set by the library itself). */
typedef void (*tko__test_hook_fn)(void);
#ifdef TKO_TEST_SEAMS
extern _Atomic int tko__test_thread_create_errno;
/* Test seam: when set, every thread creation calls it first, on the
 * creating thread (a test holds a spawner there; never set by the library). */
extern _Atomic(tko__test_hook_fn) tko__test_thread_create_hook;
#endif

/* Starts a library thread (pool workers, the timer thread, a coalescer's
 * thread): default scheduling policy (not the creator's) and asynchronous
 * signals blocked; the seam above applies. 0 or -EAGAIN. */
int tko__thread_create(pthread_t *out, void *(*main_fn)(void *), void *arg);

/* Where and how a pool's worker threads run (tko_options.cpus, .ncpus,
 * .stack_size), checked once at create. The CPU set is a bitmap of its own,
 * not a cpu_set_t, so that this header needs no _GNU_SOURCE. */
typedef struct tko__thread_place {
  size_t stack_size; /* 0 = the platform's default; else whole pages */
  bool pinned;       /* cpus applies */
  uint64_t cpus[TKO__CPU_WORDS];
} tko__thread_place;
/* -EINVAL: a count without a list, an empty list, a CPU number of
 * TKO_MAX_CPUS or more, a set with none of the CPUs the calling thread may
 * use, a stack under TKO_MIN_STACK_SIZE; -EAGAIN: a stack the system
 * cannot give (whole pages of it overflow, or the platform refuses it);
 * -ENOTSUP: CPUs asked for where affinity is not supported. */
int tko__place_init(tko__thread_place *p, const unsigned *cpus, size_t ncpus, size_t stack_size);
/* tko__thread_create, placed as p says (pool workers: the pool's place). */
int tko__thread_create_placed(pthread_t *out, void *(*main_fn)(void *), void *arg,
                              const tko__thread_place *p);

/* Test seam: when set, a retiring elastic worker calls it once it has
 * decided to retire and before it releases its count - the window that
 * its re-check of the queue closes (elastic.c). NULL outside tests. */
struct tko_pool;
#ifdef TKO_TEST_SEAMS
extern void (*_Atomic tko__test_retire_window)(struct tko_pool *pool);
/* Test seam: when set, an elastic spawner calls it with its reservation
 * and slot held, before it creates the thread (created false) and after
 * (created true, the thread running). NULL outside tests. */
extern void (*_Atomic tko__test_spawn_window)(struct tko_pool *pool, bool created);
/* Test seam: when set, a worker calls it with each task it took (its arg),
 * before it looks whether TKO_CANCEL began and starts the task or cancels
 * it (run.c: tko__run_or_cancel). NULL outside tests. */
extern void (*_Atomic tko__test_start_window)(struct tko_pool *pool, void *arg);
#endif

/* The calling thread's nice value (Linux: per thread; elsewhere 0), and a
 * best-effort set of it: raising priority back needs CAP_SYS_NICE, so a
 * failure is ignored. */
int tko__thread_nice(void);
void tko__thread_set_nice(int nice);

/* Online CPU count, at least 1. */
unsigned tko__cpu_count(void);

/* Mappings: map.c. */

/* Big growable arrays (the queue's slab once it passes TKO__MAP_MIN bytes)
 * live in their own anonymous mappings, aligned to and advised for
 * transparent huge pages, and grow by moving page tables rather than bytes.
 * Why: a first touch of a 4 KiB page is a page fault
 * (benchmarks/probes/probe_page_faults times one), so a queue growing to a
 * million tasks (48 MiB) would fault on every page, plus realloc's copies
 * under the queue lock; with huge pages the same growth faults once per
 * 2 MiB. The size is rounded up to
 * whole huge pages (TKO__MAP_ALIGN); tko__map_size says how much a request
 * really maps. The switch comes at 512 KiB (~11,000 queued tasks), not at
 * a whole huge page: the 4 KiB pages of a malloc'd slab between the two
 * slow a fresh pool's floods (bench_quick, fresh pools, shows it), for at
 * most 1.5 MiB more memory in a pool that had that backlog.
 * Without Linux's mmap/mremap these fall back to malloc/realloc/free. */
#define TKO__MAP_MIN ((size_t)512 << 10)
#define TKO__MAP_ALIGN ((size_t)2 << 20)
size_t tko__map_size(size_t bytes);
/* A new mapping of tko__map_size(bytes) bytes, or NULL. */
void *tko__map_alloc(size_t bytes);
/* Grows a mapping of old_bytes to one of new_bytes (both as requested,
 * before rounding), keeping its contents; NULL and the old one untouched if
 * there is no memory. */
void *tko__map_grow(void *p, size_t old_bytes, size_t new_bytes);
void tko__map_free(void *p, size_t bytes);

/* Descriptors: fd.c. */

/* A readiness descriptor for event loops (completion.c): an eventfd on
 * Linux, a pipe elsewhere (or on Linux with TKO_NO_EVENTFD, or while the
 * test seam below is set). fds[0] is the end to watch and clear, fds[1] the
 * end to signal; an eventfd is both. Non-blocking and close-on-exec.
 * 0 or a negative errno. */
#if defined(__linux__) && !defined(TKO_NO_EVENTFD)
#define TKO_HAVE_EVENTFD 1
#endif
int tko__wakefd_open(int fds[2]);
/* Makes fds[0] readable (a full pipe already is). */
void tko__wakefd_signal(const int fds[2]);
/* Reads fds[0] until it is no longer readable. */
void tko__wakefd_clear(const int fds[2]);
void tko__wakefd_close(const int fds[2]);
/* Test seam: when set, tko__wakefd_open makes a pipe even where eventfd
 * exists, so the fallback runs in the Linux test suites. */
#ifdef TKO_TEST_SEAMS
extern _Atomic int tko__test_wakefd_pipe;
#endif

#endif
