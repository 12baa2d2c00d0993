/* Platform primitives; see prim.h. */
#define _GNU_SOURCE
#include "prim.h"

#include <errno.h>
#include <pthread.h>
#include <sys/resource.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef TKO_HAVE_FUTEX
#include <linux/futex.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
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

_Atomic int tko__test_thread_create_errno;

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

unsigned tko__cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1u : (unsigned)n;
}
