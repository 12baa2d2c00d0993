/* SPDX-License-Identifier: MIT */
/* taskorch-workbench: try pool shapes and loads by hand and see what the
 * scheduler does. Commands: run, list, --help, --version. Exit status: 0 on
 * success, 1 when a run or an output file fails, 2 for bad input. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "wb.h"

static int list_scenarios(void) {
  printf("Scenarios (run one with: %s run --scenario NAME [options]):\n\n", WB_PROG);
  for (size_t i = 0; wb_scenario_at(i); i++) {
    wb_scenario_describe(stdout, wb_scenario_at(i));
    putchar('\n');
  }
  printf("Any option of `run` replaces the scenario's default; see '%s run --help'.\n", WB_PROG);
  return 0;
}

typedef struct output {
  const char *path;
  FILE *f;
} output;

/* Opens every output file before the run, so a bad path costs no run. */
static int open_output(output *o, const char *path) {
  o->path = path;
  o->f = NULL;
  if (!path) return 0;
  o->f = fopen(path, "w");
  if (!o->f) {
    char q[WB_QUOTE_MAX];
    fprintf(stderr, "%s: cannot write '%s': %s (see '%s run --help')\n", WB_PROG,
            wb_quote(q, sizeof q, path),
            strerror(errno), WB_PROG);
    return WB_EXIT_USAGE;
  }
  return 0;
}

static int close_output(output *o, int write_rc) {
  if (!o->f) return 0;
  int rc = write_rc;
  if (fclose(o->f) != 0) rc = -1;
  char q[WB_QUOTE_MAX];
  if (rc) fprintf(stderr, "%s: writing '%s' failed\n", WB_PROG, wb_quote(q, sizeof q, o->path));
  return rc ? 1 : 0;
}

static int run_command(int argc, char **argv) {
  wb_config cfg;
  int rc = wb_cli_parse_run(argc, argv, &cfg);
  if (rc < 0) {
    wb_cli_usage(stdout);
    return 0;
  }
  if (rc) return rc;

  output json, csv, svg;
  if ((rc = open_output(&json, cfg.json_path))) return rc;
  if ((rc = open_output(&csv, cfg.timeline_path))) {
    if (json.f) fclose(json.f);
    return rc;
  }
  if ((rc = open_output(&svg, cfg.plot_path))) {
    if (json.f) fclose(json.f);
    if (csv.f) fclose(csv.f);
    return rc;
  }

  wb_result res;
  int status = 0;
  if (wb_run(&cfg, &res) != 0 || wb_summarize(&res) != 0) {
    status = 1;
  } else {
    wb_report_table(stdout, &res);
    fflush(stdout);
    if (res.submit_errors) status = 1;
  }
  int w;
  w = json.f && !status ? wb_report_json(json.f, &res) : 0;
  status |= close_output(&json, w);
  w = csv.f && !status ? wb_timeline_write_csv(csv.f, &res.timeline) : 0;
  status |= close_output(&csv, w);
  w = svg.f && !status ? wb_plot_svg(svg.f, &res) : 0;
  status |= close_output(&svg, w);
  wb_result_free(&res);
  return status;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "%s: missing command (run or list); see '%s --help'\n", WB_PROG, WB_PROG);
    return WB_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  char q[WB_QUOTE_MAX];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    wb_cli_usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version")) {
    printf("%s %s\n", WB_PROG, tko_version_string());
    return 0;
  }
  if (!strcmp(cmd, "list")) {
    if (argc > 2) {
      fprintf(stderr, "%s: list takes no arguments (got '%s'); see '%s --help'\n", WB_PROG,
              wb_quote(q, sizeof q, argv[2]), WB_PROG);
      return WB_EXIT_USAGE;
    }
    return list_scenarios();
  }
  if (!strcmp(cmd, "run")) return run_command(argc - 2, argv + 2);
  fprintf(stderr, "%s: unknown command '%s' (run or list); see '%s --help'\n", WB_PROG,
          wb_quote(q, sizeof q, cmd), WB_PROG);
  return WB_EXIT_USAGE;
}
