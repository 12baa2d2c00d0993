/* SPDX-License-Identifier: MIT */
/* taskorch-workbench: try pool shapes and loads by hand and see what the
 * scheduler does. Commands: run, list, --help, --version (-V). Exit status:
 * 0 on success, 1 when a run, an output file or standard output fails, 2
 * for bad input, 130 when Ctrl-C stopped the run. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* A failed write to standard output already reported as an output's ('-'). */
static bool stdout_reported;

/* An output file. A regular file (or a new one) is written as a temporary
 * file beside it and renamed over it only when the run finished and the
 * writing succeeded, so a failed or interrupted run leaves an existing file
 * as it was. "-" is standard output; a device or FIFO is written in place. */
typedef struct output {
  const char *path;
  char *tmp; /* the temporary file, or NULL when written in place */
  FILE *f;
} output;

static int output_error(const char *path, int err) {
  char q[WB_QUOTE_MAX];
  fprintf(stderr, "%s: cannot write '%s': %s (see '%s run --help')\n", WB_PROG,
          wb_quote(q, sizeof q, path), strerror(err), WB_PROG);
  return WB_EXIT_USAGE;
}

/* Opens every output file before the run, so a bad path costs no run. */
static int open_output(output *o, const char *path) {
  *o = (output){.path = path};
  if (!path) return 0;
  if (!strcmp(path, "-")) {
    o->f = stdout;
    return 0;
  }
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return output_error(path, EISDIR);
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    o->f = fopen(path, "w");
    return o->f ? 0 : output_error(path, errno);
  }
  size_t n = strlen(path) + sizeof ".XXXXXX";
  if (!(o->tmp = malloc(n))) return output_error(path, ENOMEM);
  snprintf(o->tmp, n, "%s.XXXXXX", path);
  int fd = mkstemp(o->tmp);
  int err = errno;
  if (fd >= 0) {
    mode_t mask = umask(0); /* mkstemp makes it 0600: give what fopen would */
    umask(mask);
    fchmod(fd, 0666 & ~mask);
    if ((o->f = fdopen(fd, "w"))) return 0;
    err = errno;
    close(fd);
    unlink(o->tmp);
  }
  free(o->tmp);
  o->tmp = NULL;
  return output_error(path, err);
}

/* Finishes an output: with keep (the run finished and write_rc is 0) the
 * file is renamed into place, else the temporary file is dropped. Returns
 * 1 when keeping failed. */
static int close_output(output *o, bool keep, int write_rc) {
  if (!o->f) return 0;
  int rc = write_rc;
  if (o->f == stdout) {
    if (fflush(stdout) != 0) rc = -1;
  } else if (fclose(o->f) != 0) {
    rc = -1;
  }
  if (o->tmp) {
    if (keep && !rc && rename(o->tmp, o->path) != 0) rc = -1;
    if (!keep || rc) unlink(o->tmp);
    free(o->tmp);
  }
  if (!keep || !rc) return 0;
  if (o->f == stdout) stdout_reported = true;
  char q[WB_QUOTE_MAX];
  fprintf(stderr, "%s: writing '%s' failed\n", WB_PROG, wb_quote(q, sizeof q, o->path));
  return 1;
}

/* A closed standard descriptor is taken by /dev/null opened read-only, so
 * no output file opened later gets its number (the summary would go into
 * it) and a write to a closed standard output still fails, as finish_stdout
 * reports. */
static void hold_standard_fds(void) {
  for (int fd = 0; fd <= 2; fd++) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int got = open("/dev/null", O_RDONLY);
    if (got >= 0 && got != fd) close(got); /* a lower one was closed too: filled first */
  }
}

/* A write to standard output that failed (a full disk, a closed pipe with
 * SIGPIPE ignored, a closed descriptor) is an error: one line, status 1. */
static int finish_stdout(int status) {
  errno = 0;
  if ((fflush(stdout) == 0 && !ferror(stdout)) || stdout_reported) return status;
  int err = errno;
  fprintf(stderr, "%s: writing standard output failed%s%s\n", WB_PROG, err ? ": " : "",
          err ? strerror(err) : "");
  return status ? status : 1;
}

static int run_command(int argc, char **argv) {
  wb_config cfg;
  int rc = wb_cli_parse_run(argc, argv, &cfg);
  if (rc < 0) {
    wb_cli_usage(stdout);
    return 0;
  }
  if (rc) return rc;

  /* Ctrl-C is taken by the run from here on, so no temporary file is left
   * behind by it; one pressed after the run ends is delivered at the end. */
  wb_interrupt intr;
  wb_interrupt_block(&intr);
  output json = {0}, csv = {0}, svg = {0};
  if (!(rc = open_output(&json, cfg.json_path)) && !(rc = open_output(&csv, cfg.timeline_path)))
    rc = open_output(&svg, cfg.plot_path);
  if (rc) {
    close_output(&json, false, 0);
    close_output(&csv, false, 0);
    wb_interrupt_unblock(&intr);
    return rc;
  }

  /* With an output on standard output, the summary goes to stderr. */
  FILE *table = json.f == stdout || csv.f == stdout || svg.f == stdout ? stderr : stdout;
  wb_result res;
  int status = 0;
  if (wb_run(&cfg, &intr, &res) != 0 || wb_summarize(&res) != 0) {
    status = 1;
  } else {
    wb_report_table(table, &res);
    fflush(table);
    if (res.submit_errors) status = 1;
  }
  /* A run stopped by Ctrl-C writes no output: existing files stay as they were. */
  bool keep = !status && !res.interrupted;
  int w;
  w = keep && json.f ? wb_report_json(json.f, &res) : 0;
  status |= close_output(&json, keep, w);
  w = keep && csv.f ? wb_timeline_write_csv(csv.f, &res.timeline) : 0;
  status |= close_output(&csv, keep, w);
  w = keep && svg.f ? wb_plot_svg(svg.f, &res) : 0;
  status |= close_output(&svg, keep, w);
  if (res.interrupted) status = 130;
  wb_result_free(&res);
  wb_interrupt_unblock(&intr);
  return status;
}

static int command(int argc, char **argv);

int main(int argc, char **argv) {
  hold_standard_fds();
  return finish_stdout(command(argc, argv));
}

static int command(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "%s: missing command (run or list); see '%s --help'\n", WB_PROG, WB_PROG);
    return WB_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  char q[WB_QUOTE_MAX];
  bool help = !strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help");
  bool version = !strcmp(cmd, "--version") || !strcmp(cmd, "-V");
  if ((help || version) && argc > 2) {
    fprintf(stderr, "%s: %s takes no arguments (got '%s'); see '%s --help'\n", WB_PROG, cmd,
            wb_quote(q, sizeof q, argv[2]), WB_PROG);
    return WB_EXIT_USAGE;
  }
  if (help) {
    wb_cli_usage(stdout);
    return 0;
  }
  if (version) {
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
