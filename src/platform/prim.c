/* SPDX-License-Identifier: MIT */
/* Platform primitives; see prim.h. */
#define _GNU_SOURCE
#include "prim.h"
#include "seam.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#ifdef TKO_HAVE_FUTEX
#include <linux/futex.h>
#endif
#include <fcntl.h>
#include <stdbool.h>
#ifdef TKO_HAVE_EVENTFD
#include <sys/eventfd.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#include <sys/syscall.h>
#define TKO_HAVE_MREMAP 1
#endif

uint64_t tko__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void tko__deadline_after(struct timespec *ts, long ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

bool tko__time_before(const struct timespec *a, const struct timespec *b) {
  return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

int tko__cond_wait_until(pthread_cond_t *cv, tko__mutex *mu, const struct timespec *deadline,
                         bool (*done)(void *ctx), void *ctx) {
  while (!done(ctx)) {
    if (!deadline) tko__cond_wait(cv, mu);
    else if (tko__cond_timedwait(cv, mu, deadline) == ETIMEDOUT)
      return done(ctx) ? 0 : -ETIMEDOUT;
  }
  return 0;
}

#ifdef TKO_HAVE_FUTEX
void tko__futex_wait(atomic_uint *word, unsigned expected, uint64_t timeout_ns) {
  struct timespec ts, *tsp = NULL;
  if (timeout_ns != UINT64_MAX) {
    ts.tv_sec = (time_t)(timeout_ns / 1000000000u);
    ts.tv_nsec = (long)(timeout_ns % 1000000000u);
    tsp = &ts;
  }
  /* A relative timeout; EINTR, EAGAIN and ETIMEDOUT all just return, and the
   * caller re-checks the word. */
  syscall(SYS_futex, (void *)word, FUTEX_WAIT_PRIVATE, expected, tsp, NULL, 0);
}

void tko__futex_wake_one(atomic_uint *word) {
  syscall(SYS_futex, (void *)word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void tko__word_wait(atomic_uint *word, unsigned expected, uint64_t timeout_ns) {
  tko__futex_wait(word, expected, timeout_ns);
}

void tko__word_wake_all(atomic_uint *word) {
  syscall(SYS_futex, (void *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
#else
/* The fallback's pairs: process-wide by nature, as a futex table is; no
 * pool depends on another through them (a shared pair costs a spurious
 * wake at most). Made on first use; their condition variables use the
 * default clock, CLOCK_REALTIME, which any platform has. */
enum { WORD_STRIPES = 64 };
static struct word_stripe {
  tko__mutex mu; /* guards the sleep on cv: see prim.h */
  pthread_cond_t cv;
} word_stripes[WORD_STRIPES];
static pthread_once_t word_once = PTHREAD_ONCE_INIT;

static void word_stripes_init(void) {
  for (unsigned i = 0; i < WORD_STRIPES; i++) {
    (void)tko__mutex_init(&word_stripes[i].mu, TKO__RANK_WORD_WAIT);
    pthread_cond_init(&word_stripes[i].cv, NULL);
  }
}

static struct word_stripe *stripe_of(const atomic_uint *word) {
  pthread_once(&word_once, word_stripes_init);
  return &word_stripes[tko__mix64((uint64_t)(uintptr_t)word) % WORD_STRIPES];
}

void tko__word_wait(atomic_uint *word, unsigned expected, uint64_t timeout_ns) {
  struct word_stripe *st = stripe_of(word);
  tko__mutex_lock(&st->mu);
  /* seq_cst: after the lock, so a change made before the waker's lock of
   * this mutex is seen here, or its broadcast finds this thread asleep. */
  if (atomic_load(word) == expected) {
    if (timeout_ns == UINT64_MAX) {
      tko__cond_wait(&st->cv, &st->mu);
    } else {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      uint64_t ns = (uint64_t)ts.tv_nsec + timeout_ns % 1000000000u;
      ts.tv_sec += (time_t)(timeout_ns / 1000000000u + ns / 1000000000u);
      ts.tv_nsec = (long)(ns % 1000000000u);
      (void)tko__cond_timedwait(&st->cv, &st->mu, &ts);
    }
  }
  tko__mutex_unlock(&st->mu);
}

void tko__word_wake_all(atomic_uint *word) {
  struct word_stripe *st = stripe_of(word);
  tko__mutex_lock(&st->mu);
  pthread_cond_broadcast(&st->cv);
  tko__mutex_unlock(&st->mu);
}
#endif

void tko__thread_set_name(const char *name) {
#if defined(__linux__)
  char buf[16];
  strncpy(buf, name, sizeof buf - 1);
  buf[sizeof buf - 1] = '\0';
  pthread_setname_np(pthread_self(), buf);
#elif defined(__APPLE__)
  pthread_setname_np(name);
#else
  (void)name;
#endif
}

/* Process-wide by nature: a fork affects every pool of the process alike,
 * so this counter makes no pool depend on another. */
static atomic_uint fork_generation;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void) {
  atomic_fetch_add_explicit(&fork_generation, 1, memory_order_relaxed);
}

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, on_fork_child); }

void tko__fork_watch(void) { pthread_once(&fork_once, register_fork_handler); }

unsigned tko__fork_generation(void) {
  /* Relaxed: the child runs on the forking thread, which made the change. */
  return atomic_load_explicit(&fork_generation, memory_order_relaxed);
}

#ifdef TKO_TEST_SEAMS
_Atomic int tko__test_thread_create_errno;
_Atomic(tko__test_hook_fn) tko__test_thread_create_hook;
#endif

int tko__thread_create(pthread_t *out, void *(*main_fn)(void *), void *arg) {
  return tko__thread_create_placed(out, main_fn, arg, NULL);
}

static int place_apply(const tko__thread_place *p, pthread_attr_t *attr);

int tko__thread_create_placed(pthread_t *out, void *(*main_fn)(void *), void *arg,
                              const tko__thread_place *p) {
  tko__test_hook_fn hook = TKO__SEAM(tko__test_thread_create_hook); /* prim.h, seam.h */
  if (hook) hook();
  if (TKO__SEAM(tko__test_thread_create_errno)) return -EAGAIN;
  pthread_attr_t attr;
  if (pthread_attr_init(&attr)) return -EAGAIN;
  /* Workers get the default policy and priority, not the creating thread's
   * (a submitter with a real-time policy must not make the pool real-time). */
  struct sched_param sp = {0};
  pthread_attr_setinheritsched(&attr, PTHREAD_EXPLICIT_SCHED);
  pthread_attr_setschedpolicy(&attr, SCHED_OTHER);
  pthread_attr_setschedparam(&attr, &sp);
  int placed = p ? place_apply(p, &attr) : 0;
  if (placed) {
    pthread_attr_destroy(&attr);
    return placed;
  }
  /* Block asynchronous signals in workers so the host's handlers run on the
   * host's threads; the new thread inherits this mask. Synchronous faults
   * stay deliverable. */
  sigset_t all, old;
  sigfillset(&all);
  sigdelset(&all, SIGSEGV);
  sigdelset(&all, SIGBUS);
  sigdelset(&all, SIGFPE);
  sigdelset(&all, SIGILL);
  sigdelset(&all, SIGTRAP);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(out, &attr, main_fn, arg);
  if (rc == EPERM) {
    /* A creator in SCHED_IDLE (or with a raised nice) may not hand a new
     * thread SCHED_OTHER without CAP_SYS_NICE: inherit rather than fail. */
    pthread_attr_setinheritsched(&attr, PTHREAD_INHERIT_SCHED);
    rc = pthread_create(out, &attr, main_fn, arg);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  return rc ? -EAGAIN : 0;
}

int tko__thread_nice(void) {
#if defined(__linux__)
  errno = 0;
  int n = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
  return errno ? 0 : n;
#else
  return 0;
#endif
}

void tko__thread_set_nice(int nice) {
#if defined(__linux__)
  id_t tid = (id_t)syscall(SYS_gettid);
  errno = 0;
  int now = getpriority(PRIO_PROCESS, tid);
  if (errno == 0 && now != nice) (void)setpriority(PRIO_PROCESS, tid, nice);
#else
  (void)nice;
#endif
}

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

#ifdef TKO_TEST_SEAMS
_Atomic int tko__test_wakefd_pipe;
#endif

static int set_nonblock_cloexec(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -errno;
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) return -errno;
  return 0;
}

int tko__wakefd_open(int fds[2]) {
#ifdef TKO_HAVE_EVENTFD
  if (!TKO__SEAM(tko__test_wakefd_pipe)) { /* prim.h, seam.h */
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) return -errno;
    fds[0] = fds[1] = fd;
    return 0;
  }
#endif
  if (pipe(fds) < 0) return -errno;
  int rc = set_nonblock_cloexec(fds[0]);
  if (rc == 0) rc = set_nonblock_cloexec(fds[1]);
  if (rc) tko__wakefd_close(fds);
  return rc;
}

/* An eventfd is one descriptor: it takes and gives 8-byte counters. */
static bool is_eventfd(const int fds[2]) { return fds[0] == fds[1]; }

void tko__wakefd_signal(const int fds[2]) {
  uint64_t one = 1;
  /* Only EAGAIN can fail here (an eventfd counter at its maximum, a full
   * pipe), and then the descriptor is readable anyway. */
  ssize_t r = write(fds[1], &one, is_eventfd(fds) ? sizeof one : 1);
  (void)r;
}

void tko__wakefd_clear(const int fds[2]) {
  uint64_t buf[8];
  /* An eventfd resets in one read (EAGAIN if it was 0); a pipe is read
   * until a short read says it is empty. */
  size_t len = is_eventfd(fds) ? sizeof buf[0] : sizeof buf;
  while (read(fds[0], buf, len) == (ssize_t)len && !is_eventfd(fds)) {
  }
}

void tko__wakefd_close(const int fds[2]) {
  close(fds[0]);
  if (!is_eventfd(fds)) close(fds[1]);
}

/* A worker's stack as tko_options.stack_size promises it: whole pages, and
 * at least the platform's minimum. glibc would round a ragged size down
 * (1 MiB and a byte gives 1 MiB), so the rounding is done here, upwards.
 * 0 where no size can be given: whole pages of it overflow size_t, or the
 * platform's attributes refuse it. */
static size_t stack_size_granted(size_t asked) {
  size_t size = asked;
  /* A platform whose minimum is above TKO_MIN_STACK_SIZE gets its minimum. */
  if (size < (size_t)PTHREAD_STACK_MIN) size = (size_t)PTHREAD_STACK_MIN;
  long pg = sysconf(_SC_PAGESIZE);
  size_t page = pg > 0 ? (size_t)pg : 4096;
  if (size > SIZE_MAX - (page - 1)) return 0;
  size = (size + page - 1) / page * page;
  /* Asked once now, so that a size the platform refuses fails create
   * rather than a later elastic spawn. */
  pthread_attr_t attr;
  if (pthread_attr_init(&attr)) return 0;
  int rc = pthread_attr_setstacksize(&attr, size);
  pthread_attr_destroy(&attr);
  return rc ? 0 : size;
}

int tko__place_init(tko__thread_place *p, const unsigned *cpus, size_t ncpus, size_t stack_size) {
  memset(p, 0, sizeof *p);
  if (stack_size && stack_size < TKO_MIN_STACK_SIZE) return -EINVAL;
  if (stack_size) {
    p->stack_size = stack_size_granted(stack_size);
    if (!p->stack_size) return -EAGAIN; /* the system cannot give it */
  }
  if (!cpus) return ncpus ? -EINVAL : 0;
  if (!ncpus) return -EINVAL; /* an empty set: no CPU to run on */
  for (size_t i = 0; i < ncpus; i++) {
    if (cpus[i] >= TKO_MAX_CPUS) return -EINVAL;
    p->cpus[cpus[i] / 64] |= (uint64_t)1 << (cpus[i] % 64);
  }
  p->pinned = true;
#if defined(__linux__)
  /* The kernel runs a thread on the CPUs of its mask that it may use; none
   * would fail every thread start, so say so now. */
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return 0; /* cannot tell */
  for (unsigned c = 0; c < TKO_MAX_CPUS && c < CPU_SETSIZE; c++)
    if ((p->cpus[c / 64] >> (c % 64) & 1) && CPU_ISSET(c, &allowed)) return 0;
  return -EINVAL;
#else
  return -ENOTSUP;
#endif
}

/* Sets p's stack size and CPUs on a thread's attributes; -EAGAIN if the
 * stack size is refused (tko__place_init already asked once, so only a
 * platform that changed its mind refuses it here). */
static int place_apply(const tko__thread_place *p, pthread_attr_t *a) {
  if (p->stack_size && pthread_attr_setstacksize(a, p->stack_size)) return -EAGAIN;
#if defined(__linux__)
  if (p->pinned) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (unsigned c = 0; c < TKO_MAX_CPUS && c < CPU_SETSIZE; c++)
      if (p->cpus[c / 64] >> (c % 64) & 1) CPU_SET(c, &set);
    pthread_attr_setaffinity_np(a, sizeof set, &set);
  }
#endif
  return 0;
}

unsigned tko__cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1u : (unsigned)n;
}
