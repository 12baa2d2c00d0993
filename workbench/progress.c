/* SPDX-License-Identifier: MIT */
/* The live progress line on stderr: a bar, percent done, done/total,
 * tasks/s over the last second, queue depth, busy and live workers, ETA.
 * Drawn by the sampler thread at most 10 times a second, only when stderr
 * is a terminal, and erased at the end so the summary starts on a clean
 * line. It always fits the terminal's width, less its last column: on a
 * narrow one the fields give way first (busy workers, queue, rate, ETA,
 * count), then the bar, so at 80 columns the bar stays. */
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
  wb_rate rate;       /* completed tasks at past draws */
  char line[512];     /* "\r", the line, "\033[K" */
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

/* The terminal's width: stderr's window size, else $COLUMNS, else 80. */
static unsigned term_cols(void) {
  struct winsize ws;
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  const char *env = getenv("COLUMNS");
  if (env && *env) {
    char *end;
    unsigned long c = strtoul(env, &end, 10);
    if (!*end && c > 0 && c <= 10000) return (unsigned)c;
  }
  return 80;
}

wb_progress *wb_progress_new(uint64_t total) {
  if (!isatty(STDERR_FILENO)) return NULL;
  wb_progress *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->total = total;
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

/* 8 -> "8s", 125 -> "2m05s", 7300 -> "2h01m"; past 99 hours, ">99h". */
static void fmt_eta(char *buf, size_t len, double s) {
  if (s < 59.5)
    snprintf(buf, len, "%.0fs", s);
  else if (s < 3600)
    snprintf(buf, len, "%um%02us", (unsigned)(s + 0.5) / 60, (unsigned)(s + 0.5) % 60);
  else if (s < 100 * 3600.0)
    snprintf(buf, len, "%uh%02um", (unsigned)s / 3600, (unsigned)s % 3600 / 60);
  else
    snprintf(buf, len, ">99h");
}

/* The line's fields in the order shown; they are dropped from the last
 * in DROP_ORDER while the line is too wide. The percentage stays. */
enum { F_PCT, F_COUNT, F_RATE, F_QUEUE, F_BUSY, F_ETA, NFIELDS };
static const int DROP_ORDER[] = {F_BUSY, F_QUEUE, F_RATE, F_ETA, F_COUNT};
#define BAR_MIN 10
#define BAR_MAX 30
#define FIELD_MAX 48

/* The fields in `keep` joined: pct and count by a space, the rest by " | ". */
static size_t join_fields(char *out, size_t len, char f[NFIELDS][FIELD_MAX], const bool *keep) {
  size_t n = 0;
  out[0] = '\0';
  for (int i = 0; i < NFIELDS; i++) {
    if (!keep[i]) continue;
    const char *sep = n == 0 ? "" : i == F_COUNT ? " " : " | ";
    int w = snprintf(out + n, len - n, "%s%s", sep, f[i]);
    if (w < 0 || (size_t)w >= len - n) break;
    n += (size_t)w;
  }
  return n;
}

size_t wb_progress_format(char *buf, size_t len, unsigned cols, const wb_progress_view *v) {
  if (!len) return 0;
  buf[0] = '\0';
  /* The last column is left empty: a character there makes some
   * terminals wrap, and the next \r then redraws a line too low. */
  size_t width = cols > 1 ? cols - 1 : 0;
  if (width > len - 1) width = len - 1;
  unsigned pct = v->total ? (unsigned)(v->done >= v->total ? 100 : v->done * 100 / v->total) : 100;
  char f[NFIELDS][FIELD_MAX], a[16], b[16];
  snprintf(f[F_PCT], FIELD_MAX, "%3u%%", pct);
  fmt_count(a, sizeof a, (double)v->done);
  fmt_count(b, sizeof b, (double)v->total);
  snprintf(f[F_COUNT], FIELD_MAX, "%s/%s", a, b);
  fmt_count(a, sizeof a, v->rate);
  snprintf(f[F_RATE], FIELD_MAX, "%s/s", a);
  fmt_count(a, sizeof a, (double)v->queued);
  snprintf(f[F_QUEUE], FIELD_MAX, "queue %s", a);
  snprintf(f[F_BUSY], FIELD_MAX, "busy %" PRIu64 " of %u+%u", v->running, v->basic, v->elastic);
  uint64_t left = v->total > v->done ? v->total - v->done : 0;
  if (v->rate > 0)
    fmt_eta(a, sizeof a, (double)left / v->rate);
  else
    snprintf(a, sizeof a, "--");
  snprintf(f[F_ETA], FIELD_MAX, "ETA %s", a);

  bool keep[NFIELDS] = {true, true, true, true, true, true};
  char text[NFIELDS * (FIELD_MAX + 3)];
  size_t drop = 0, tl;
  /* Fields give way to a bar of BAR_MIN, down to the percentage and the
   * count; then the bar gives way; then the count. */
  for (;;) {
    tl = join_fields(text, sizeof text, f, keep);
    if (tl + 3 + BAR_MIN <= width) break;
    if (drop + 1 < sizeof DROP_ORDER / sizeof DROP_ORDER[0]) {
      keep[DROP_ORDER[drop++]] = false;
      continue;
    }
    if (tl <= width) break; /* no bar */
    if (keep[F_COUNT]) {
      keep[F_COUNT] = false;
      continue;
    }
    return 0; /* not even the percentage fits */
  }
  size_t n = 0;
  if (tl + 3 + BAR_MIN <= width) {
    size_t bar = width - tl - 3;
    if (bar > BAR_MAX) bar = BAR_MAX;
    size_t fill = bar * pct / 100;
    buf[n++] = '[';
    for (size_t i = 0; i < bar; i++) buf[n++] = i < fill ? '#' : '.';
    buf[n++] = ']';
    buf[n++] = ' ';
  }
  memcpy(buf + n, text, tl);
  n += tl;
  buf[n] = '\0';
  return n;
}

void wb_progress_update(wb_progress *p, const wb_sample *s) {
  if (p->drawn && s->t_ns - p->last_draw_ns < DRAW_NS) return;
  p->last_draw_ns = s->t_ns;
  wb_progress_view v = {.done = s->completed,
                        .total = p->total,
                        .queued = s->queued,
                        .running = s->running,
                        .basic = s->basic,
                        .elastic = s->elastic,
                        .rate = wb_rate_push(&p->rate, s->t_ns, s->completed)};
  /* Read at every draw, so a resized terminal gets a line that fits. */
  unsigned cols = term_cols();
  p->line[0] = '\r';
  size_t n = 1 + wb_progress_format(p->line + 1, sizeof p->line - 5, cols, &v);
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
