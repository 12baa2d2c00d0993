/* SPDX-License-Identifier: MIT */
/* Ctrl-C during a run. The workbench blocks SIGINT in its main thread before
 * it creates an output file or starts any thread (the pool's workers,
 * producers and sampler inherit the block), and one watcher thread takes
 * the signal with sigwait: no handler runs in an arbitrary thread, so the
 * callback may take locks and call the pool.
 *
 * The first Ctrl-C calls fn once. SIGINT stays blocked everywhere for the
 * rest of the run, and the watcher takes every later one and does nothing
 * with it: the first already stops the run promptly (run.c), and a signal
 * that killed the process at its default action would leave the output
 * files' temporaries behind and print no summary. So two SIGINTs - a second
 * Ctrl-C, or timeout(1), which signals its child and then the child's
 * process group - end the run as one does: summary, no file, status 130.
 * One that comes after the watcher has stopped is dropped in
 * wb_interrupt_unblock when the run was interrupted, and delivered there
 * (the default action) when it was not.
 *
 * A SIGINT that was ignored when the run began (a background job of a
 * non-interactive shell) stays ignored. */
#include <signal.h>
#include <time.h>

#include "wb.h"

static void *watch_main(void *arg) {
  wb_interrupt *w = arg;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  for (;;) {
    int sig;
    if (sigwait(&set, &sig) != 0) continue;
    pthread_mutex_lock(&w->mu);
    bool stop = w->stop; /* the SIGINT may be wb_interrupt_stop's own */
    bool first = !stop && !w->fired;
    if (first) w->fired = true;
    pthread_mutex_unlock(&w->mu);
    if (stop) return NULL;
    if (first) w->fn(w->arg);
  }
}

void wb_interrupt_block(wb_interrupt *w) {
  struct sigaction sa;
  w->active = sigaction(SIGINT, NULL, &sa) == 0 && sa.sa_handler != SIG_IGN;
  w->started = w->fired = w->stop = false;
  if (!w->active) return;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, &w->old_mask);
}

int wb_interrupt_watch(wb_interrupt *w, void (*fn)(void *), void *arg) {
  if (!w->active) return 0;
  w->fn = fn;
  w->arg = arg;
  pthread_mutex_init(&w->mu, NULL);
  int rc = pthread_create(&w->thread, NULL, watch_main, w);
  if (rc) {
    pthread_mutex_destroy(&w->mu);
    return -rc;
  }
  w->started = true;
  return 0;
}

bool wb_interrupt_stop(wb_interrupt *w) {
  if (!w->started) return false;
  pthread_mutex_lock(&w->mu);
  w->stop = true;
  bool fired = w->fired;
  pthread_mutex_unlock(&w->mu);
  /* Ends its sigwait, or its next one if fn still runs. SIGINT stays
   * blocked in this thread, so it can go only to the watcher. */
  pthread_kill(w->thread, SIGINT);
  pthread_join(w->thread, NULL);
  pthread_mutex_destroy(&w->mu);
  w->started = false;
  return fired;
}

void wb_interrupt_unblock(wb_interrupt *w) {
  if (!w->active) return;
  if (w->fired) {
    /* This run has answered a Ctrl-C already: later ones are dropped. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    struct timespec now = {0, 0};
    while (sigtimedwait(&set, NULL, &now) == SIGINT) {
    }
  }
  /* A Ctrl-C pressed since the watcher stopped of a run that finished is
   * delivered here. */
  pthread_sigmask(SIG_SETMASK, &w->old_mask, NULL);
  w->active = false;
}
