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

#define HISTORY 11 /* draws kept for the rate: the last second */
#define DRAW_NS 100000000u

struct wb_progress {
  uint64_t total;
  uint64_t last_draw_ns;
  bool drawn;
  unsigned cols;
  unsigned nh, head;  /* ring of (time, completed) at past draws */
  uint64_t hist_t[HISTORY], hist_c[HISTORY];
  char line[512];
};

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

  unsigned oldest = p->nh < HISTORY ? 0 : p->head;
  p->hist_t[p->head] = s->t_ns;
  p->hist_c[p->head] = s->completed;
  p->head = (p->head + 1) % HISTORY;
  if (p->nh < HISTORY) p->nh++;
  double dt = (double)(s->t_ns - p->hist_t[oldest]) * 1e-9;
  double rate = dt > 0 ? (double)(s->completed - p->hist_c[oldest]) / dt : 0;

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
