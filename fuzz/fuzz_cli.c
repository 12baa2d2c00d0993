/* SPDX-License-Identifier: MIT */
/* libFuzzer harness for the workbench's argument parser
 * (workbench/cli.c: wb_cli_parse_run, the `run` subcommand). The input is
 * split at NUL bytes and newlines into up to 64 arguments. The parser must
 * never crash or read out of bounds, must answer 0 (parsed), -1 (--help)
 * or WB_EXIT_USAGE (bad input, one line on stderr), and a parsed
 * configuration must satisfy the checks the parser promises: a scenario,
 * a pool with at least one worker, bursts <= tasks, a forward weight
 * range, percentages within 0..100, limits respected.
 *
 * The parser's error lines go to stderr through stdio; the harness points
 * the stdio stream at /dev/null so they do not flood the fuzzer's output
 * (libFuzzer and the sanitizers write to file descriptor 2 directly, so
 * their reports still show). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wb.h"

#define CHECK(cond)                                                                \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(real_stderr, "fuzz_cli: check failed at line %d: %s\n", __LINE__, #cond); \
      abort();                                                                     \
    }                                                                              \
  } while (0)

static FILE *real_stderr;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  real_stderr = stderr;
  FILE *null = fopen("/dev/null", "w");
  if (null) stderr = null;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4096) return 0;
  /* One copy with a terminator after every argument, so the parser's
   * strings end exactly where the input says (ASan sees any overread). */
  char *buf = malloc(size + 1);
  if (!buf) return 0;
  memcpy(buf, data, size);
  buf[size] = '\0';
  char *argv[65];
  int argc = 0;
  char *start = buf;
  for (size_t i = 0; i <= size && argc < 64; i++) {
    if (buf[i] == '\0' || buf[i] == '\n') {
      buf[i] = '\0';
      argv[argc++] = start;
      start = buf + i + 1;
    }
  }
  argv[argc] = NULL;
  /* Each argument in its own exact-size allocation. */
  for (int i = 0; i < argc; i++) {
    size_t n = strlen(argv[i]) + 1;
    char *a = malloc(n);
    if (!a) {
      for (int k = 0; k < i; k++) free(argv[k]);
      free(buf);
      return 0;
    }
    memcpy(a, argv[i], n);
    argv[i] = a;
  }
  wb_config cfg;
  memset(&cfg, 0xa5, sizeof cfg);
  int rc = wb_cli_parse_run(argc, argv, &cfg);
  CHECK(rc == 0 || rc == -1 || rc == WB_EXIT_USAGE);
  if (rc == 0) {
    CHECK(cfg.scenario != NULL);
    CHECK(cfg.pool == WB_POOL_BASIC || cfg.pool == WB_POOL_ELASTIC);
    CHECK(cfg.workers <= TKO_MAX_WORKERS);
    CHECK(cfg.max_elastic <= TKO_MAX_ELASTIC);
    if (cfg.pool == WB_POOL_BASIC) CHECK(cfg.workers >= 1 && cfg.max_elastic == 0);
    else CHECK(cfg.workers + cfg.max_elastic >= 1);
    CHECK(cfg.tasks >= 1 && cfg.tasks <= WB_MAX_TASKS);
    CHECK(cfg.producers >= 1 && cfg.producers <= WB_MAX_PRODUCERS);
    CHECK(cfg.bursts >= 1 && cfg.bursts <= cfg.tasks);
    CHECK(cfg.weights.lo <= cfg.weights.hi);
    CHECK(cfg.io_pct >= 0 && cfg.io_pct <= 100);
    CHECK(cfg.fail_pct >= 0 && cfg.fail_pct <= 100);
    CHECK(cfg.tail_ms >= 0);
    /* Paths point into the arguments (or are unset). */
    const char *paths[] = {cfg.json_path, cfg.timeline_path};
    for (size_t i = 0; i < 2; i++) {
      if (!paths[i]) continue;
      bool inside = false;
      for (int k = 0; k < argc && !inside; k++)
        inside = paths[i] >= argv[k] && paths[i] < argv[k] + strlen(argv[k]) + 1;
      CHECK(inside);
    }
  }
  /* The usage text must print whatever was parsed. */
  if (rc == -1) wb_cli_usage(stderr);
  for (int i = 0; i < argc; i++) free(argv[i]);
  free(buf);
  return 0;
}
