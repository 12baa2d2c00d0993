/* SPDX-License-Identifier: MIT */
/* The end-of-run summary, as a table for people and as JSON for scripts.
 * Both show the same numbers; workbench/README.md documents the JSON. */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "wb.h"

/* A duration for people: "850 ns", "12.3 us", "4.56 ms", "1.23 s". */
void wb_fmt_ns(char *buf, size_t len, double ns) {
  if (ns < 1e3)
    snprintf(buf, len, "%.0f ns", ns);
  else if (ns < 1e6)
    snprintf(buf, len, "%.1f us", ns / 1e3);
  else if (ns < 1e9)
    snprintf(buf, len, "%.2f ms", ns / 1e6);
  else
    snprintf(buf, len, "%.2f s", ns / 1e9);
}

static double throughput(const wb_result *r) {
  return r->active_s > 0 ? (double)r->stats.completed / r->active_s : 0;
}

static void wait_row(FILE *f, const char *label, const wb_dist *d) {
  char p50[16], p90[16], p99[16], max[16];
  wb_fmt_ns(p50, sizeof p50, (double)d->p50);
  wb_fmt_ns(p90, sizeof p90, (double)d->p90);
  wb_fmt_ns(p99, sizeof p99, (double)d->p99);
  wb_fmt_ns(max, sizeof max, (double)d->max);
  if (!d->count)
    fprintf(f, "  %-20s %8d %10s %10s %10s %10s\n", label, 0, "-", "-", "-", "-");
  else
    fprintf(f, "  %-20s %8" PRIu64 " %10s %10s %10s %10s\n", label, d->count, p50, p90, p99,
            max);
}

void wb_report_table(FILE *f, const wb_result *r) {
  const wb_config *c = &r->cfg;
  char a[16], b[16], d[16], e[16];
  fprintf(f, "%s %s: scenario %s\n", WB_PROG, tko_version_string(), c->scenario->name);
  wb_config_describe(f, c, "  ");
  fprintf(f, "  task mix checksum: 0x%016" PRIx64 "\n\n", r->mix_checksum);
  if (r->interrupted)
    fprintf(f,
            "interrupted by Ctrl-C after %" PRIu64 " of %" PRIu64 " tasks were submitted: "
            "the figures cover the tasks that ran; the queued ones were cancelled and no "
            "output file was written\n\n",
            r->stats.submitted, c->tasks);

  fprintf(f, "%-18s %.3f s", "wall time", r->wall_s);
  if (r->wall_s - r->active_s > 0.0005)
    fprintf(f, " (tasks in flight %.3f s, idle between floods %.3f s)", r->active_s,
            r->wall_s - r->active_s);
  fprintf(f, "\n%-18s %.0f tasks/s%s\n", "throughput", throughput(r),
          c->bursts > 1 ? " (while tasks were in flight)" : "");
  const tko_stats *s = &r->stats;
  fprintf(f, "%-18s %" PRIu64 " completed, %" PRIu64 " failed (%.2f%%), %" PRIu64
             " cancelled, %" PRIu64 " not accepted\n",
          "tasks", s->completed, s->failed,
          s->completed ? 100.0 * (double)s->failed / (double)s->completed : 0.0, s->cancelled,
          r->submit_errors);
  if (r->submit_errors)
    fprintf(f, "%-18s first refusal: %s\n", "", tko_strerror(r->first_submit_error));
  if (c->groups || c->capacity || c->async)
    fprintf(f,
            "%-18s %" PRIu64 " groups waited, %" PRIu64 " submits rejected and retried, %" PRIu64
            " tasks run by callers, async in flight at the end: %u\n",
            "features", r->groups_waited, r->rejected, s->caller_runs,
            r->before_shutdown.async_inflight);
  if (c->handles)
    fprintf(f,
            "%-18s %" PRIu64 " waited, %" PRIu64 " ended cancelled; cancels: %" PRIu64
            " before the start, %" PRIu64 " too late; %" PRIu64 " broken promises\n",
            "handles", r->handles_waited, r->handles_cancelled, r->cancels_won, r->cancels_late,
            r->handles_broken);
  if (c->resize.on && !r->resized)
    fprintf(f, "%-18s not reached (the run stopped first)\n", "resize");
  else if (c->resize.on)
    fprintf(f, "%-18s to %u basic + up to %u elastic at %.3f s: %s\n", "resize",
            c->resize.basic, c->resize.max_elastic, r->resize_at_s,
            r->resize_rc ? tko_strerror(r->resize_rc) : "done");
  wb_fmt_ns(a, sizeof a, r->run.mean);
  wb_fmt_ns(b, sizeof b, (double)r->run.p50);
  wb_fmt_ns(d, sizeof d, (double)r->run.p99);
  wb_fmt_ns(e, sizeof e, (double)r->run.max);
  fprintf(f, "%-18s mean %s, p50 %s, p99 %s, max %s\n", "run time per task", a, b, d, e);
  const tko_stats *es = &r->before_shutdown;
  /* The most the pool allowed: after a resize, the larger of the two. */
  unsigned max_elastic = c->resize.on && c->resize.max_elastic > c->max_elastic
                             ? c->resize.max_elastic
                             : c->max_elastic;
  if (c->pool == WB_POOL_ELASTIC)
    fprintf(f,
            "%-18s peak %u of %u, spawned %" PRIu64 ", retired %" PRIu64 "; %" PRIu64
            " tasks (%.0f%%) ran on them\n",
            "elastic workers", es->elastic_peak, max_elastic, es->elastic_spawned,
            es->elastic_retired, r->ran_on_elastic,
            r->wait.count ? 100.0 * (double)r->ran_on_elastic / (double)r->wait.count : 0.0);
  else
    fprintf(f, "%-18s none (basic pool of %u)\n", "elastic workers", c->workers);
  if (r->allocs_known)
    fprintf(f, "%-18s %.4f per task (%" PRIu64 " from first submit to shutdown, %s)\n",
            "allocations", (double)r->allocs / (double)c->tasks, r->allocs, wb_allocs_source());
  else
    fprintf(f, "%-18s n/a (built without jemalloc)\n", "allocations");

  fprintf(f, "\n%-22s %8s %10s %10s %10s %10s\n", "queue wait", "tasks", "p50", "p90", "p99",
          "max");
  wait_row(f, "all", &r->wait);
  for (unsigned i = 0; i < r->nclasses; i++) {
    const wb_class *k = &r->classes[i];
    char label[40];
    if (k->lo == k->hi)
      snprintf(label, sizeof label, "weight %d", k->lo);
    else
      snprintf(label, sizeof label, "weights %d..%d", k->lo, k->hi);
    wait_row(f, label, &k->wait);
  }
}

static void json_num(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.6g", v);
  else
    fputs("null", f);
}

static void json_dist(FILE *f, const wb_dist *d) {
  fprintf(f,
          "{\"count\": %" PRIu64 ", \"mean\": ", d->count);
  json_num(f, d->mean);
  fprintf(f, ", \"p50\": %" PRIu64 ", \"p90\": %" PRIu64 ", \"p99\": %" PRIu64
             ", \"max\": %" PRIu64 "}",
          d->p50, d->p90, d->p99, d->max);
}

int wb_report_json(FILE *f, const wb_result *r) {
  const wb_config *c = &r->cfg;
  const tko_stats *s = &r->stats, *es = &r->before_shutdown;
  /* Scenario names are plain identifiers from the table: no escaping needed. */
  fprintf(f, "{\n  \"version\": \"%s\",\n  \"scenario\": \"%s\",\n", tko_version_string(),
          c->scenario->name);
  fprintf(f, "  \"seed\": %" PRIu64 ",\n  \"mix_checksum\": \"0x%016" PRIx64 "\",\n", c->seed,
          r->mix_checksum);
  fprintf(f,
          "  \"config\": {\"pool\": \"%s\", \"workers\": %u, \"max_elastic\": %u, "
          "\"idle_ms\": %u, \"tasks\": %" PRIu64 ", \"producers\": %u, \"weight_lo\": %d, "
          "\"weight_hi\": %d, \"task_us\": %u, \"io_ms\": %u, \"io_pct\": ",
          c->pool == WB_POOL_ELASTIC ? "elastic" : "basic", c->workers, c->max_elastic,
          c->idle_ms, c->tasks, c->producers, c->weights.lo, c->weights.hi, c->task_us,
          c->io_ms);
  json_num(f, c->io_pct);
  fputs(", \"fail_pct\": ", f);
  json_num(f, c->fail_pct);
  fprintf(f, ", \"bursts\": %u, \"gap_ms\": %u, \"tail_ms\": %ld", c->bursts, c->gap_ms,
          c->tail_ms);
  fprintf(f,
          ", \"groups\": %u, \"handles\": %u, \"cancel_pct\": %g, \"batch\": %u, "
          "\"capacity\": %" PRIu64 ", \"full\": \"%s\", "
          "\"aging_ms\": %u, \"blocking_hint\": %s, \"delay_ms\": %u, \"async\": %s, "
          "\"max_async\": %u},\n",
          c->groups, c->handles, c->cancel_pct, c->batch, c->capacity, wb_full_name(c->full),
          c->aging_ms,
          c->blocking_hint ? "true" : "false", c->delay_ms, c->async ? "true" : "false",
          c->max_async);
  fputs("  \"wall_s\": ", f);
  json_num(f, r->wall_s);
  fputs(",\n  \"active_s\": ", f);
  json_num(f, r->active_s);
  fputs(",\n  \"throughput_per_s\": ", f);
  json_num(f, throughput(r));
  fprintf(f,
          ",\n  \"tasks\": {\"submitted\": %" PRIu64 ", \"completed\": %" PRIu64
          ", \"failed\": %" PRIu64 ", \"cancelled\": %" PRIu64 ", \"submit_errors\": %" PRIu64
          ", \"rejected\": %" PRIu64 ", \"caller_runs\": %" PRIu64 ", \"groups\": %" PRIu64 "},\n",
          s->submitted, s->completed, s->failed, s->cancelled, r->submit_errors, r->rejected,
          s->caller_runs, r->groups_waited);
  if (c->handles)
    fprintf(f,
            "  \"handles\": {\"waited\": %" PRIu64 ", \"cancelled\": %" PRIu64
            ", \"cancels_won\": %" PRIu64 ", \"cancels_late\": %" PRIu64 ", \"broken\": %" PRIu64
            "},\n",
            r->handles_waited, r->handles_cancelled, r->cancels_won, r->cancels_late,
            r->handles_broken);
  else
    fputs("  \"handles\": null,\n", f);
  if (c->resize.on)
    fprintf(f, "  \"resize\": {\"basic\": %u, \"max_elastic\": %u, \"done\": %s, "
               "\"at_s\": %.6g, \"error\": \"%s\"},\n",
            c->resize.basic, c->resize.max_elastic, r->resized ? "true" : "false",
            r->resize_at_s, tko_err_name(r->resize_rc));
  else
    fputs("  \"resize\": null,\n", f);
  fputs("  \"wait_ns\": ", f);
  json_dist(f, &r->wait);
  fputs(",\n  \"run_ns\": ", f);
  json_dist(f, &r->run);
  fputs(",\n  \"weight_classes\": [", f);
  for (unsigned i = 0; i < r->nclasses; i++) {
    fprintf(f, "%s\n    {\"lo\": %d, \"hi\": %d, \"wait_ns\": ", i ? "," : "", r->classes[i].lo,
            r->classes[i].hi);
    json_dist(f, &r->classes[i].wait);
    fputs("}", f);
  }
  fprintf(f,
          "\n  ],\n  \"elastic\": {\"peak\": %u, \"spawned\": %" PRIu64 ", \"retired\": %" PRIu64
          ", \"tasks_run\": %" PRIu64 "},\n",
          es->elastic_peak, es->elastic_spawned, es->elastic_retired, r->ran_on_elastic);
  if (r->allocs_known) {
    fprintf(f, "  \"allocations\": {\"source\": \"%s\", \"total\": %" PRIu64 ", \"per_task\": ",
            wb_allocs_source(), r->allocs);
    json_num(f, (double)r->allocs / (double)c->tasks);
    fputs("},\n", f);
  } else {
    fputs("  \"allocations\": {\"source\": \"none\", \"total\": null, \"per_task\": null},\n", f);
  }
  fprintf(f, "  \"timeline\": {\"samples\": %zu, \"period_ms\": ", r->timeline.n);
  json_num(f, (double)r->timeline.period_ns / 1e6);
  fputs("}\n}\n", f);
  return ferror(f) ? -1 : 0;
}
