/* SPDX-License-Identifier: MIT */
/* The live progress line on stderr: done/total, tasks/s over the last
 * second, queue depth, busy and live workers, ETA. Drawn by the sampler
 * thread at most 10 times a second, only when stderr is a terminal, and
 * erased at the end so the summary starts on a clean line. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "wb.h"

#define DRAW_NS 100000000u

struct wb_progress {
  uint64_t total;
  uint64_t last_draw_ns;
  bool drawn;
  unsigned cols;
  wb_rate rate;       /* completed tasks at past draws */
  char line[512];
};

/* The oldest entry is read before the new one may overwrite its slot: once
 * the ring is full, head is both the oldest entry and the next slot to
 * write (reading it after the write made every rate 0 after a second). */
double wb_rate_push(wb_rate *r, uint64_t t_ns, uint64_t count) {
  unsigned oldest = r->n < WB_RATE_HISTORY ? 0 : r->head;
  uint64_t t0 = r->n ? r->t[oldest] : t_ns, c0 = r->n ? r->c[oldest] : count;
  r->t[r->head] = t_ns;
  r->c[r->head] = count;
  r->head = (r->head + 1) % WB_RATE_HISTORY;
  if (r->n < WB_RATE_HISTORY) r->n++;
  double dt = (double)(t_ns - t0) * 1e-9;
  return dt > 0 && count >= c0 ? (double)(count - c0) / dt : 0;
}

wb_progress *wb_progress_new(uint64_t total) {
  if (!isatty(STDERR_FILENO)) return NULL;
  wb_progress *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->total = total;
  struct winsize ws;
  p->cols = ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20 ? ws.ws_col : 80;
  if (p->cols > sizeof p->line - 8) p->cols = sizeof p->line - 8; /* room for "\r" and "\033[K" */
  return p;
}

/* 1234 -> "1234", 12345 -> "12.3k", 1234567 -> "1.23M". */
static void fmt_count(char *buf, size_t len, double v) {
  if (v < 10000)
    snprintf(buf, len, "%.0f", v);
  else if (v < 1e6)
    snprintf(buf, len, "%.1fk", v / 1e3);
  else
    snprintf(buf, len, "%.2fM", v / 1e6);
}

void wb_progress_update(wb_progress *p, const wb_sample *s) {
  if (p->drawn && s->t_ns - p->last_draw_ns < DRAW_NS) return;
  p->last_draw_ns = s->t_ns;

  double rate = wb_rate_push(&p->rate, s->t_ns, s->completed);

  char rate_s[16], eta[24];
  fmt_count(rate_s, sizeof rate_s, rate);
  uint64_t left = p->total > s->completed ? p->total - s->completed : 0;
  if (rate > 0)
    snprintf(eta, sizeof eta, "%.1f s", (double)left / rate);
  else
    snprintf(eta, sizeof eta, "--");
  unsigned pct = p->total ? (unsigned)(s->completed * 100 / p->total) : 100;

  char text[256];
  int tl = snprintf(text, sizeof text,
                    " %" PRIu64 "/%" PRIu64 " %3u%% | %s tasks/s | queue %" PRIu64
                    " | busy %" PRIu64 " of %u+%u workers | ETA %s",
                    s->completed, p->total, pct, rate_s, s->queued, s->running, s->basic,
                    s->elastic, eta);
  if (tl < 0) return;
  if ((unsigned)tl >= sizeof text) tl = sizeof text - 1;

  /* The bar takes what the text leaves of the terminal line, up to 30. */
  int bar = (int)p->cols - 1 - tl - 2;
  if (bar > 30) bar = 30;
  size_t n = 0;
  p->line[n++] = '\r';
  if (bar >= 5) {
    unsigned fill = (unsigned)((double)bar * (double)pct / 100.0);
    p->line[n++] = '[';
    for (int i = 0; i < bar; i++) p->line[n++] = (unsigned)i < fill ? '#' : '.';
    p->line[n++] = ']';
  }
  size_t room = p->cols - 1 > n - 1 ? p->cols - 1 - (n - 1) : 0;
  size_t copy = (size_t)tl < room ? (size_t)tl : room;
  memcpy(p->line + n, text, copy);
  n += copy;
  memcpy(p->line + n, "\033[K", 4); /* erase the rest of the old line */
  fputs(p->line, stderr);
  fflush(stderr);
  p->drawn = true;
}

void wb_progress_clear(wb_progress *p) {
  if (p && p->drawn) {
    fputs("\r\033[K", stderr);
    fflush(stderr);
  }
}

void wb_progress_free(wb_progress *p) {
  free(p);
}
