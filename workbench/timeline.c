/* SPDX-License-Identifier: MIT */
/* The timeline: a sampler thread reads tko_pool_stats into a buffer
 * allocated before the run, and drives the progress line.
 *
 * The sampling period scales with the run: it starts at 1 ms, and when the
 * buffer (WB_TIMELINE_CAP samples) fills, every other sample is dropped and
 * the period doubles. So a run of any length keeps its whole shape in
 * between half and all of the buffer (a 50 ms run gets ~50 samples, a
 * 10-minute one ~1,100 at 512 ms), in bounded memory.
 *
 * Ticks are counted from the run's start, t0 + k * step, with absolute
 * sleeps so the period does not drift; step is the period, but at most the
 * progress line's 100 ms. A sampler that oversleeps (a loaded machine)
 * skips the ticks it missed rather than bunching samples up. */
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
  /* Relaxed is enough: the flag carries no data, and the join in
   * wb_sampler_stop orders the thread's writes before the caller's reads. */
  atomic_bool stop;
};

int wb_timeline_alloc(wb_timeline *tl, size_t cap) {
  tl->s = malloc(cap * sizeof *tl->s);
  tl->n = 0;
  tl->cap = tl->s ? cap : 0;
  tl->period_ns = WB_SAMPLE_MIN_NS;
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

bool wb_timeline_add(wb_timeline *tl, const wb_sample *x, bool last) {
  if (tl->n) {
    uint64_t prev = tl->s[tl->n - 1].t_ns;
    /* One sample per period; the last one whenever it is a microsecond (the
     * CSV's resolution) after the one before. */
    if (last ? x->t_ns < prev + 1000u : x->t_ns / tl->period_ns <= prev / tl->period_ns)
      return false;
  }
  if (tl->n == tl->cap) {
    size_t j = 0;
    for (size_t i = 0; i < tl->n; i += 2) tl->s[j++] = tl->s[i];
    tl->n = j;
    tl->period_ns *= 2;
  }
  tl->s[tl->n++] = *x;
  return true;
}

static void *sampler_main(void *arg) {
  wb_sampler *s = arg;
  wb_sample x = read_sample(s);
  wb_timeline_add(s->tl, &x, false);
  if (s->progress) wb_progress_update(s->progress, &x);
  while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
    uint64_t step = s->tl->period_ns < WB_SAMPLE_MAX_STEP_NS ? s->tl->period_ns
                                                              : WB_SAMPLE_MAX_STEP_NS;
    uint64_t next = s->t0 + (x.t_ns / step + 1) * step;
    struct timespec ts = {(time_t)(next / 1000000000u), (long)(next % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
    if (atomic_load_explicit(&s->stop, memory_order_relaxed)) break;
    x = read_sample(s);
    wb_timeline_add(s->tl, &x, false);
    if (s->progress) wb_progress_update(s->progress, &x);
  }
  /* The last sample: the timeline ends where the run did. */
  x = read_sample(s);
  wb_timeline_add(s->tl, &x, true);
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
