/* SPDX-License-Identifier: MIT */
/* Ctrl-C during a run. The workbench blocks SIGINT in its main thread before
 * it creates an output file or starts any thread (the pool's workers,
 * producers and sampler inherit the block), and one watcher thread takes
 * the signal with sigwait: no handler
 * runs in an arbitrary thread, so the callback may take locks and call the
 * pool. The first Ctrl-C calls fn once; from then on the watcher leaves
 * SIGINT unblocked at its default action, so a second one ends the process
 * at once, even while fn still waits for running tasks. A SIGINT that was
 * ignored when the run began (a background job of a non-interactive shell)
 * stays ignored. */
#include <signal.h>

#include "wb.h"

static void *watch_main(void *arg) {
  wb_interrupt *w = arg;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  int sig;
  while (sigwait(&set, &sig) != 0) {
  }
  pthread_mutex_lock(&w->mu);
  bool stop = w->stop; /* the SIGINT was wb_interrupt_stop's own */
  w->fired = !stop;
  pthread_mutex_unlock(&w->mu);
  if (stop) return NULL;
  /* Unblocked only after fired is set, so wb_interrupt_stop never sends
   * its SIGINT to a thread that no longer blocks it. */
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
  w->fn(w->arg);
  pthread_mutex_lock(&w->mu);
  while (!w->stop) pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
  return NULL;
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
  pthread_cond_init(&w->cv, NULL);
  int rc = pthread_create(&w->thread, NULL, watch_main, w);
  if (rc) {
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    return -rc;
  }
  w->started = true;
  return 0;
}

bool wb_interrupt_stop(wb_interrupt *w) {
  bool fired = false;
  if (w->started) {
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    fired = w->fired;
    if (fired)
      pthread_cond_signal(&w->cv);
    else
      pthread_kill(w->thread, SIGINT); /* ends its sigwait */
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    w->started = false;
  }
  return fired;
}

void wb_interrupt_unblock(wb_interrupt *w) {
  /* A Ctrl-C pressed since the watcher stopped is delivered here. */
  if (w->active) pthread_sigmask(SIG_SETMASK, &w->old_mask, NULL);
  w->active = false;
}
