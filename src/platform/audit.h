/* SPDX-License-Identifier: MIT */
/* The sharing audit: in a build configured with
 * -DTKO_SHARING_AUDIT=ON, every atomic access made through atomics.h's
 * order-named wrappers (and the queue lock) is recorded against its cache
 * line: which threads wrote and read the line, and how many loads, stores
 * and read-modify-writes it got. From those, and the task count a driver
 * supplies, the report gives per task the RMWs on lines that two or more
 * threads write (contended RMWs: each one moves the line between cores
 * once the writers run on different cores) and the stores to lines other
 * threads read, per line, and the worst line's demand. The counts depend
 * on which threads touch which lines, not on timing, so a 2-core machine
 * measures what a 64-core one would pay (benchmarks/MODEL.md).
 *
 * Not seen: plain (non-atomic) accesses - the payload of an inbox slot,
 * the queue guarded by the lock; the lock's RMWs stand for its critical
 * section - and atomic_* calls that bypass the wrappers.
 *
 * Test-only: the driver is benchmarks/audit_sharing.c. In a build without
 * the option none of this is compiled and the wrappers are plain atomics. */
#ifndef TKO_AUDIT_H
#define TKO_AUDIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum tko__audit_kind { TKO__AUDIT_LOAD, TKO__AUDIT_STORE, TKO__AUDIT_RMW };

/* Records one access to the line holding p by the calling thread. */
void tko__audit_note(const volatile void *p, enum tko__audit_kind kind);
/* Records a compare-exchange (an RMW; a failed one still takes the line
 * exclusively) and returns its result. */
bool tko__audit_cas(const volatile void *p, bool succeeded);

/* The calling thread took (+1) or is about to release (-1) the queue lock
 * whose word is at p. Accesses made while holding it are counted per line:
 * critical sections run one at a time, so the lines their holders fetch
 * add up to one serial cost across every thread, however many lines they
 * spread over (the inbox slots a drain reads). Plain accesses under the
 * lock (the queue itself) are not seen. */
void tko__audit_locked(const volatile void *p, int delta);

/* Names the calling thread's role ("producer", "worker"): the report
 * counts a line's writers by role. The string must outlive the audit. */
void tko__audit_name_thread(const char *role);
/* How many threads of this role a bitmap of a line's threads holds. */
unsigned tko__audit_count_role(uint64_t threads, const char *role);
/* Names [base, base + size): the report prints "name+0xOFF" for lines
 * inside an object (the pool), and lists the fields (labels of at most 64
 * bytes) a line holds, "[inbox.tail]". Up to 32 labels. */
void tko__audit_label(const void *base, size_t size, const char *name);

/* Forgets every count, keeping names and labels: call it while no audited
 * thread is running (an idle pool), to measure a phase from a clean start. */
void tko__audit_reset(void);

/* One line's figures, and the run's, per task. */
typedef struct tko__audit_line {
  uintptr_t addr;            /* the line's first byte */
  uint64_t writers, readers; /* bitmaps of audit thread ids (id 63: 63 and up) */
  uint64_t loads, stores, rmws, cas_failed;
  uint64_t handoffs;      /* writes whose previous writer was another thread: timing-dependent */
  uint64_t foreign_loads; /* loads by a thread other than the line's last writer */
  uint64_t locked;        /* accesses under a queue lock (its acquisition included) */
  size_t under;           /* internal: which lock (the last one held at an access) */
  double demand;          /* see audit.c: transfers this line needs per task, at most */
} tko__audit_line;

typedef struct tko__audit_summary {
  uint64_t tasks, threads, lines, lines_shared, overflow;
  double contended_rmws_per_task; /* RMWs on lines two or more threads write */
  double shared_stores_per_task;  /* stores to lines another thread reads */
  double handoffs_per_task;       /* observed: depends on the interleaving */
  double serialised_per_task;     /* bound on line fetches in one lock's sections, */
  uintptr_t worst_lock;           /* for the lock whose sections fetch most (0: none) */
  tko__audit_line worst;          /* the shared line with the highest demand */
} tko__audit_summary;

/* Sums what has been recorded since the last reset, for `tasks` tasks. */
void tko__audit_summarize(uint64_t tasks, tko__audit_summary *out);
/* Prints the summary and the `top` shared lines with the highest demand. */
void tko__audit_report(FILE *f, uint64_t tasks, unsigned top);

#endif
