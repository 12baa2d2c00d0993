/* SPDX-License-Identifier: MIT */
/* The --plot chart: one self-contained SVG file (no scripts, fonts or links)
 * with two panels. Top: the timeline, queued tasks on the left axis and
 * running tasks and live basic/elastic workers on the right, against time
 * in seconds. Bottom: queue wait p50 and p99 per weight class, on a log
 * scale since the classes can differ by orders of magnitude. */
#include <math.h>
#include <string.h>

#include "wb.h"

#define W 960
#define H 740
#define L 80            /* plot area, left edge */
#define R (W - 80)      /* plot area, right edge */
#define T1 100          /* timeline panel, top and bottom */
#define B1 360
#define T2 480          /* latency panel */
#define B2 650

#define C_QUEUED "#1f77b4"
#define C_RUNNING "#d62728"
#define C_BASIC "#a1d99b"
#define C_ELASTIC "#bcbddc"
#define C_P50 "#6baed6"
#define C_P99 "#08519c"

static void text_escaped(FILE *f, const char *s) {
  for (; *s; s++) {
    switch (*s) {
      case '&': fputs("&amp;", f); break;
      case '<': fputs("&lt;", f); break;
      case '>': fputs("&gt;", f); break;
      case '"': fputs("&quot;", f); break;
      default: fputc(*s, f);
    }
  }
}

/* A round step (1, 2 or 5 times a power of ten) giving about n ticks. */
static double nice_step(double range, int n) {
  double raw = range / n;
  double p = pow(10, floor(log10(raw)));
  double m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

static double nice_ceil(double v) {
  if (v <= 1) return 1;
  double step = nice_step(v, 5);
  return ceil(v / step) * step;
}

typedef double (*sample_get)(const wb_sample *s);
static double get_queued(const wb_sample *s) { return (double)s->queued; }
static double get_running(const wb_sample *s) { return (double)s->running; }
static double get_basic(const wb_sample *s) { return s->basic; }
static double get_workers(const wb_sample *s) { return (double)s->basic + s->elastic; }

typedef struct axes {
  double t_max, left_max, right_max;
} axes;

static double px_t(const axes *a, uint64_t t_ns) {
  return L + (double)t_ns * 1e-9 / a->t_max * (R - L);
}

static double px_y(double v, double max) {
  return B1 - v / max * (B1 - T1);
}

/* Step-wise points of one series, left to right ("x,y " pairs). */
static void step_points(FILE *f, const wb_timeline *tl, const axes *a, sample_get get,
                        double max) {
  for (size_t i = 0; i < tl->n; i++) {
    double y = px_y(get(&tl->s[i]), max);
    fprintf(f, "%.1f,%.1f ", px_t(a, tl->s[i].t_ns), y);
    if (i + 1 < tl->n) fprintf(f, "%.1f,%.1f ", px_t(a, tl->s[i + 1].t_ns), y);
  }
}

/* The same, right to left, to close a band. */
static void step_points_back(FILE *f, const wb_timeline *tl, const axes *a, sample_get get,
                             double max) {
  for (size_t i = tl->n; i-- > 0;) {
    double y = px_y(get(&tl->s[i]), max);
    if (i + 1 < tl->n) fprintf(f, "%.1f,%.1f ", px_t(a, tl->s[i + 1].t_ns), y);
    fprintf(f, "%.1f,%.1f ", px_t(a, tl->s[i].t_ns), y);
  }
}

static void legend_item(FILE *f, double x, double y, const char *color, bool area,
                        const char *label) {
  if (area)
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"18\" height=\"10\" fill=\"%s\"/>\n", x,
            y - 9, color);
  else
    fprintf(f,
            "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" "
            "stroke-width=\"2\"/>\n",
            x, y - 4, x + 18, y - 4, color);
  fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">", x + 24, y);
  text_escaped(f, label);
  fputs("</text>\n", f);
}

static void timeline_panel(FILE *f, const wb_result *r) {
  const wb_timeline *tl = &r->timeline;
  axes a = {0.01, 1, 1};
  for (size_t i = 0; i < tl->n; i++) {
    const wb_sample *s = &tl->s[i];
    if ((double)s->t_ns * 1e-9 > a.t_max) a.t_max = (double)s->t_ns * 1e-9;
    if ((double)s->queued > a.left_max) a.left_max = (double)s->queued;
    if (get_workers(s) > a.right_max) a.right_max = get_workers(s);
    if ((double)s->running > a.right_max) a.right_max = (double)s->running;
  }
  double cap = (double)r->cfg.workers + r->cfg.max_elastic;
  if (cap > a.right_max) a.right_max = cap;
  a.left_max = nice_ceil(a.left_max);
  a.right_max = nice_ceil(a.right_max);

  fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"15\" font-weight=\"bold\">"
             "Pool timeline (sampled every %g ms)</text>\n", L, T1 - 42,
          (double)tl->period_ns / 1e6);
  legend_item(f, L, T1 - 16, C_QUEUED, false, "queued tasks (left axis)");
  legend_item(f, L + 200, T1 - 16, C_RUNNING, false, "running tasks (right axis)");
  legend_item(f, L + 410, T1 - 16, C_BASIC, true, "basic workers (right)");
  legend_item(f, L + 590, T1 - 16, C_ELASTIC, true, "elastic workers (right)");

  /* Grid and axes. */
  double ts = nice_step(a.t_max, 8);
  for (double t = 0; t <= a.t_max * 1.0001; t += ts) {
    double x = L + t / a.t_max * (R - L);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#eee\"/>\n", x, T1,
            x, B1);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", x, B1 + 16, t);
  }
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">time since start (s)</text>\n",
          (L + R) / 2, B1 + 36);
  double ls = nice_step(a.left_max, 5), rs = nice_step(a.right_max, 5);
  for (double v = 0; v <= a.left_max * 1.0001; v += ls) {
    double y = px_y(v, a.left_max);
    fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/>\n", L, y, R,
            y);
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" fill=\"%s\">%g</text>\n", L - 6,
            y + 4, C_QUEUED, v);
  }
  for (double v = 0; v <= a.right_max * 1.0001; v += rs)
    fprintf(f, "<text x=\"%d\" y=\"%.1f\">%g</text>\n", R + 6, px_y(v, a.right_max) + 4, v);
  fprintf(f,
          "<text transform=\"translate(%d %d) rotate(-90)\" text-anchor=\"middle\" "
          "fill=\"%s\">queued tasks</text>\n",
          L - 50, (T1 + B1) / 2, C_QUEUED);
  fprintf(f,
          "<text transform=\"translate(%d %d) rotate(90)\" text-anchor=\"middle\">"
          "tasks running / worker threads</text>\n",
          R + 44, (T1 + B1) / 2);

  if (tl->n) {
    /* Worker bands (right axis): basic from 0, elastic stacked on top. */
    fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.8\" points=\"", C_BASIC);
    step_points(f, tl, &a, get_basic, a.right_max);
    fprintf(f, "%.1f,%d %.1f,%d\"/>\n", px_t(&a, tl->s[tl->n - 1].t_ns), B1,
            px_t(&a, tl->s[0].t_ns), B1);
    fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.8\" points=\"", C_ELASTIC);
    step_points(f, tl, &a, get_workers, a.right_max);
    step_points_back(f, tl, &a, get_basic, a.right_max);
    fputs("\"/>\n", f);
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
            C_RUNNING);
    step_points(f, tl, &a, get_running, a.right_max);
    fputs("\"/>\n", f);
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
            C_QUEUED);
    step_points(f, tl, &a, get_queued, a.left_max);
    fputs("\"/>\n", f);
  }
  fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
             "stroke=\"#333\"/>\n", L, T1, R - L, B1 - T1);
}

/* Label widths are estimated at EM_WIDTH of the font size a character (a
 * little more than sans-serif digits take), so labels can be fitted without
 * the font at hand: this returns the font size, at most max_px, at which
 * chars characters fit in width_px. */
#define EM_WIDTH 0.6
static double fit_font(double max_px, double width_px, size_t chars) {
  double fs = width_px / (EM_WIDTH * (double)(chars ? chars : 1));
  return fs < max_px ? fs : max_px;
}

/* A duration in 6 characters at most: "850ns", "12.3us", "4.56ms", "1.23s". */
static void fmt_ns_short(char *buf, size_t len, double ns) {
  static const char *unit[] = {"ns", "us", "ms", "s"};
  int u = 0;
  while (u < 3 && ns >= 999.5) {
    ns /= 1e3;
    u++;
  }
  const char *fmt = u == 0 || ns >= 99.95 ? "%.0f%s" : ns >= 9.995 ? "%.1f%s" : "%.2f%s";
  snprintf(buf, len, fmt, ns, unit[u]);
}

/* A weight class's label under its bars, in width_px: "all", "weight 3" or
 * "LO..HI", cut into "LO.." and "HI" on two lines when one is too wide. */
static void class_label(FILE *f, double cx, double width_px, const wb_class *k) {
  char one[40], hi[16];
  if (!k)
    snprintf(one, sizeof one, "all");
  else if (k->lo == k->hi)
    snprintf(one, sizeof one, "weight %d", k->lo);
  else
    snprintf(one, sizeof one, "%d..%d", k->lo, k->hi);
  if (!k || k->lo == k->hi || fit_font(12, width_px, strlen(one)) >= 12) {
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"%.1f\">%s</text>\n",
            cx, B2 + 16, fit_font(12, width_px, strlen(one)), one);
    return;
  }
  snprintf(one, sizeof one, "%d..", k->lo);
  snprintf(hi, sizeof hi, "%d", k->hi);
  size_t wide = strlen(one) > strlen(hi) ? strlen(one) : strlen(hi);
  double fs = fit_font(12, width_px, wide);
  fprintf(f,
          "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"%.1f\">%s"
          "<tspan x=\"%.1f\" dy=\"%.1f\">%s</tspan></text>\n",
          cx, B2 + 16, fs, one, cx, 1.2 * fs, hi);
}

/* "1 ns", "10 us", "100 ms", "1 s" for a decade. */
static void decade_label(char *buf, size_t len, int e) {
  static const char *unit[] = {"ns", "us", "ms", "s"};
  int u = e / 3 > 3 ? 3 : e / 3;
  int p = e - 3 * u;
  double v = pow(10, p);
  snprintf(buf, len, "%g %s", v, unit[u]);
}

static void latency_panel(FILE *f, const wb_result *r) {
  unsigned groups = 1 + r->nclasses;
  const wb_dist *d[1 + WB_MAX_CLASSES];
  d[0] = &r->wait;
  for (unsigned i = 0; i < r->nclasses; i++) d[1 + i] = &r->classes[i].wait;
  double lo = 1e300, hi = 1;
  for (unsigned g = 0; g < groups; g++) {
    if (d[g]->p50 > 0 && (double)d[g]->p50 < lo) lo = (double)d[g]->p50;
    if ((double)d[g]->p99 > hi) hi = (double)d[g]->p99;
  }
  if (lo > hi) lo = hi;
  int e_lo = (int)floor(log10(lo)), e_hi = (int)ceil(log10(hi));
  if (e_lo < 0) e_lo = 0;
  if (e_hi <= e_lo) e_hi = e_lo + 1;

  fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"15\" font-weight=\"bold\">"
             "Queue wait by weight class (submit to start, log scale)</text>\n", L, T2 - 42);
  legend_item(f, L, T2 - 16, C_P50, true, "p50");
  legend_item(f, L + 90, T2 - 16, C_P99, true, "p99");

  for (int e = e_lo; e <= e_hi; e++) {
    double y = B2 - (double)(e - e_lo) / (e_hi - e_lo) * (B2 - T2);
    char label[24];
    decade_label(label, sizeof label, e);
    fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/>\n", L, y, R,
            y);
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", L - 6, y + 4,
            label);
  }
  fprintf(f,
          "<text transform=\"translate(%d %d) rotate(-90)\" text-anchor=\"middle\">"
          "queue wait</text>\n",
          L - 60, (T2 + B2) / 2);

  /* Up to 9 groups (all, then 8 classes): each label is sized to fit its
   * bar or its group, so none overlaps another however many there are. */
  double gw = (double)(R - L) / groups;
  double bw = gw * 0.45 > 48 ? 48 : gw * 0.45;
  for (unsigned g = 0; g < groups; g++) {
    double cx = L + gw * (g + 0.5);
    uint64_t v[2] = {d[g]->p50, d[g]->p99};
    const char *color[2] = {C_P50, C_P99};
    for (int k = 0; k < 2; k++) {
      double y = B2;
      if (v[k] > 0) {
        double frac = (log10((double)v[k]) - e_lo) / (e_hi - e_lo);
        y = B2 - (frac < 0 ? 0 : frac > 1 ? 1 : frac) * (B2 - T2);
      }
      double x = cx - bw + k * bw;
      char val[16], full[16];
      fmt_ns_short(val, sizeof val, (double)v[k]);
      wb_fmt_ns(full, sizeof full, (double)v[k]);
      if (!d[g]->count) snprintf(val, sizeof val, "-");
      fprintf(f,
              "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">"
              "<title>%s %s</title></rect>\n",
              x, y, bw - 2, B2 - y, color[k], k ? "p99" : "p50", full);
      fprintf(f,
              "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"%.1f\">%s</text>\n",
              x + (bw - 2) / 2, y - 4, fit_font(10, bw - 2, strlen(val)), val);
    }
    class_label(f, cx, gw - 4, g == 0 ? NULL : &r->classes[g - 1]);
  }
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">weight class "
             "(higher weights run first)</text>\n", (L + R) / 2, B2 + 48);
  fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
             "stroke=\"#333\"/>\n", L, T2, R - L, B2 - T2);
}

int wb_plot_svg(FILE *f, const wb_result *r) {
  const wb_config *c = &r->cfg;
  fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", f);
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
          "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
          W, H, W, H);
  fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
  char title[256];
  if (c->pool == WB_POOL_ELASTIC)
    snprintf(title, sizeof title,
             "%s: scenario %s, %llu tasks, elastic pool %u + up to %u (idle %u ms)", WB_PROG,
             c->scenario->name, (unsigned long long)c->tasks, c->workers, c->max_elastic,
             c->idle_ms);
  else
    snprintf(title, sizeof title, "%s: scenario %s, %llu tasks, basic pool of %u", WB_PROG,
             c->scenario->name, (unsigned long long)c->tasks, c->workers);
  fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"16\" font-weight=\"bold\">", L);
  text_escaped(f, title);
  fputs("</text>\n", f);
  timeline_panel(f, r);
  latency_panel(f, r);
  char wall[32];
  snprintf(wall, sizeof wall, "%.2f s", r->wall_s);
  fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#555\">wall %s, %.0f tasks/s, seed %llu</text>\n",
          L, H - 16, wall, r->active_s > 0 ? (double)r->stats.completed / r->active_s : 0.0,
          (unsigned long long)c->seed);
  fputs("</svg>\n", f);
  return ferror(f) ? -1 : 0;
}
