/* SPDX-License-Identifier: MIT */
/* Fault-injection helpers for the reliability suites (faults, threads,
 * misuse, process): a counting allocator that fails chosen calls, and
 * "tokens" that prove every accepted task ran or was cancelled exactly once
 * and every refused one never ran.
 *
 * The allocator is a tko_allocator: the pool (or lane table, or coalescer)
 * calls it for its own memory, so a test can fail exactly the Nth call, or
 * every call from the Nth on, and check that the failing call reports
 * -ENOMEM and that nothing leaks (live blocks back to zero). */
#ifndef TKO_TEST_FAULT_H
#define TKO_TEST_FAULT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "taskorch.h"

/* ---- counting, failing allocator ------------------------------------------ */

typedef struct tfa {
  atomic_long calls;     /* alloc and realloc calls so far (failed ones too) */
  atomic_long fail_at;   /* fail exactly this call number (1-based); 0 = never */
  atomic_long fail_from; /* fail every call from this number on; 0 = never */
  atomic_long fail_every; /* fail every call whose number is a multiple; 0 = never */
  atomic_long failures;  /* calls refused so far */
  atomic_long live;      /* blocks handed out and not yet freed */
  tko_allocator al;
} tfa;

static inline bool tfa_refuse(tfa *f) {
  long n = atomic_fetch_add(&f->calls, 1) + 1;
  long at = atomic_load(&f->fail_at), from = atomic_load(&f->fail_from);
  long every = atomic_load(&f->fail_every);
  if ((at && n == at) || (from && n >= from) || (every && n % every == 0)) {
    atomic_fetch_add(&f->failures, 1);
    return true;
  }
  return false;
}

static inline void *tfa_alloc(void *ctx, size_t size) {
  tfa *f = ctx;
  if (tfa_refuse(f)) return NULL;
  void *p = malloc(size ? size : 1);
  if (p) atomic_fetch_add(&f->live, 1);
  return p;
}

static inline void *tfa_realloc(void *ctx, void *ptr, size_t size) {
  tfa *f = ctx;
  if (tfa_refuse(f)) return NULL; /* like realloc: ptr stays valid */
  void *p = realloc(ptr, size ? size : 1);
  if (p && !ptr) atomic_fetch_add(&f->live, 1);
  return p;
}

static inline void tfa_free(void *ctx, void *ptr) {
  tfa *f = ctx;
  if (!ptr) return;
  atomic_fetch_sub(&f->live, 1);
  free(ptr);
}

static inline void tfa_init(tfa *f) {
  memset(f, 0, sizeof *f);
  f->al = (tko_allocator){tfa_alloc, tfa_realloc, tfa_free, f};
}

/* Fails the Nth call from now (N >= 1), once; failures counts from zero. */
static inline void tfa_fail_nth(tfa *f, long n) {
  atomic_store(&f->failures, 0);
  atomic_store(&f->fail_from, 0);
  atomic_store(&f->fail_at, atomic_load(&f->calls) + n);
}

/* Fails every call from the Nth from now on, until tfa_heal. */
static inline void tfa_fail_from(tfa *f, long n) {
  atomic_store(&f->failures, 0);
  atomic_store(&f->fail_at, 0);
  atomic_store(&f->fail_from, atomic_load(&f->calls) + n);
}

/* Fails one call in every k, from now until tfa_heal. */
static inline void tfa_fail_every(tfa *f, long k) { atomic_store(&f->fail_every, k); }

static inline void tfa_heal(tfa *f) {
  atomic_store(&f->fail_at, 0);
  atomic_store(&f->fail_from, 0);
  atomic_store(&f->fail_every, 0);
}

/* ---- no descriptor left ----------------------------------------------------- */

/* Leaves the process no descriptor to open: lowers the soft RLIMIT_NOFILE to
 * 64 and fills every free number below it (a new descriptor takes the lowest
 * free number, so none is left under the limit). tff_fds_restore closes them
 * and puts the limit back. Returns false if the limit could not be lowered. */
typedef struct tff_fds {
  struct rlimit saved;
  int fd[64], n;
} tff_fds;

static inline bool tff_fds_exhaust(tff_fds *f) {
  f->n = 0;
  if (getrlimit(RLIMIT_NOFILE, &f->saved)) return false;
  struct rlimit low = f->saved;
  if (low.rlim_cur > 64) low.rlim_cur = 64;
  if (setrlimit(RLIMIT_NOFILE, &low)) return false;
  for (int fd; f->n < 64 && (fd = dup(2)) >= 0;) f->fd[f->n++] = fd;
  return true;
}

static inline void tff_fds_restore(tff_fds *f) {
  while (f->n) close(f->fd[--f->n]);
  setrlimit(RLIMIT_NOFILE, &f->saved);
}

/* ---- exactly-once tokens ---------------------------------------------------- */

/* One task's life: `accepted` is set by the submitter after the call
 * returned 0; the task increments runs, the on_cancel hook cancels. */
typedef struct tft_token {
  atomic_int runs, cancels;
  bool accepted;
  int weight;
} tft_token;

static inline int tft_run(void *arg) {
  atomic_fetch_add(&((tft_token *)arg)->runs, 1);
  return 0;
}

/* For tko_hooks.on_cancel when every task's arg is a token (user unused). */
static inline void tft_on_cancel(void *user, const tko_task_info *t) {
  (void)user;
  if (t->arg) atomic_fetch_add(&((tft_token *)t->arg)->cancels, 1);
}

/* Index of the first token that breaks "accepted: ran or was cancelled
 * exactly once; refused: neither", or -1 if all hold. */
static inline long tft_first_bad(tft_token *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int r = atomic_load(&t[i].runs), c = atomic_load(&t[i].cancels);
    if (t[i].accepted ? r + c != 1 : r + c != 0) return (long)i;
  }
  return -1;
}

static inline void tft_counts(tft_token *t, size_t n, long *accepted, long *runs, long *cancels) {
  *accepted = *runs = *cancels = 0;
  for (size_t i = 0; i < n; i++) {
    *accepted += t[i].accepted;
    *runs += atomic_load(&t[i].runs);
    *cancels += atomic_load(&t[i].cancels);
  }
}

#endif
