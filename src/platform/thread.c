/* SPDX-License-Identifier: MIT */
/* Threads (prim.h): starting the library's threads with the scheduling,
 * signal mask, stack and CPUs they are promised, naming them, their nice
 * value, the CPU count, and fork detection (a forked child keeps none of
 * the threads its parent started, so whatever owns threads asks here
 * whether it runs in such a child). */
#define _GNU_SOURCE
#include "prim.h"
#include "seam.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/syscall.h>
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
