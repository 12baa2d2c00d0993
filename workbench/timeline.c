/* SPDX-License-Identifier: MIT */
/* The timeline: a sampler thread reads tko_pool_stats every 10 ms into a
 * buffer allocated before the run, and drives the progress line.
 *
 * Ticks are counted from the run's start, t0 + k * 10 ms, with absolute
 * sleeps so the period does not drift; a sampler that oversleeps (a loaded
 * machine) skips the ticks it missed rather than bunching samples up. When
 * the buffer fills, every other sample is dropped and the kept spacing
 * doubles, so a long run keeps its whole shape in bounded memory. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "wb.h"

struct wb_sampler {
  pthread_t thread;
  tko_pool *pool;
  wb_timeline *tl;      /* written only by the sampler thread until joined */
  wb_progress *progress;
  uint64_t t0;
  uint64_t keep_every;  /* ticks between kept samples: 1, 2, 4, ... */
  uint64_t last_kept;   /* tick of the last kept sample */
  /* Relaxed is enough: the flag carries no data, and the join in
   * wb_sampler_stop orders the thread's writes before the caller's reads. */
  atomic_bool stop;
};

int wb_timeline_alloc(wb_timeline *tl, size_t cap) {
  tl->s = malloc(cap * sizeof *tl->s);
  tl->n = 0;
  tl->cap = tl->s ? cap : 0;
  tl->period_ns = WB_SAMPLE_NS;
  return tl->s ? 0 : -ENOMEM;
}

void wb_timeline_free(wb_timeline *tl) {
  free(tl->s);
  tl->s = NULL;
  tl->n = tl->cap = 0;
}

static wb_sample read_sample(wb_sampler *s) {
  tko_stats st;
  tko_pool_stats(s->pool, &st);
  uint64_t now = wb_now_ns();
  return (wb_sample){.t_ns = now > s->t0 ? now - s->t0 : 0,
                     .submitted = st.submitted,
                     .completed = st.completed,
                     .queued = st.queued,
                     .running = st.running,
                     .basic = st.basic_workers,
                     .elastic = st.elastic_workers};
}

static void keep(wb_sampler *s, const wb_sample *x, uint64_t tick) {
  wb_timeline *tl = s->tl;
  if (tl->n == tl->cap) {
    size_t j = 0;
    for (size_t i = 0; i < tl->n; i += 2) tl->s[j++] = tl->s[i];
    tl->n = j;
    tl->period_ns *= 2;
    s->keep_every *= 2;
  }
  tl->s[tl->n++] = *x;
  s->last_kept = tick;
}

static void *sampler_main(void *arg) {
  wb_sampler *s = arg;
  wb_sample x = read_sample(s);
  keep(s, &x, 0);
  if (s->progress) wb_progress_update(s->progress, &x);
  uint64_t tick = 0;
  while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
    uint64_t next = s->t0 + (tick + 1) * WB_SAMPLE_NS;
    struct timespec ts = {(time_t)(next / 1000000000u), (long)(next % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
    if (atomic_load_explicit(&s->stop, memory_order_relaxed)) break;
    x = read_sample(s);
    uint64_t now_tick = x.t_ns / WB_SAMPLE_NS;
    tick = now_tick > tick ? now_tick : tick + 1;
    if (tick / s->keep_every > s->last_kept / s->keep_every) keep(s, &x, tick);
    if (s->progress) wb_progress_update(s->progress, &x);
  }
  /* The last sample, whatever the tick: the timeline ends where the run did
   * (unless the previous one is within a microsecond, the CSV's resolution). */
  x = read_sample(s);
  if (x.t_ns >= s->tl->s[s->tl->n - 1].t_ns + 1000u) keep(s, &x, tick);
  return NULL;
}

int wb_sampler_start(wb_sampler **out, tko_pool *pool, wb_timeline *tl, uint64_t t0,
                     wb_progress *progress) {
  wb_sampler *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  s->pool = pool;
  s->tl = tl;
  s->progress = progress;
  s->t0 = t0;
  s->keep_every = 1;
  atomic_init(&s->stop, false);
  int rc = pthread_create(&s->thread, NULL, sampler_main, s);
  if (rc) {
    free(s);
    return -rc;
  }
  *out = s;
  return 0;
}

void wb_sampler_stop(wb_sampler *s) {
  atomic_store_explicit(&s->stop, true, memory_order_relaxed);
  pthread_join(s->thread, NULL);
  free(s);
}

int wb_timeline_write_csv(FILE *f, const wb_timeline *tl) {
  fprintf(f, "t_ms,submitted,completed,queued,running,basic_workers,elastic_workers\n");
  for (size_t i = 0; i < tl->n; i++) {
    const wb_sample *x = &tl->s[i];
    fprintf(f, "%.3f,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%u,%u\n",
            (double)x->t_ns / 1e6, x->submitted, x->completed, x->queued, x->running,
            x->basic, x->elastic);
  }
  return ferror(f) ? -EIO : 0;
}
