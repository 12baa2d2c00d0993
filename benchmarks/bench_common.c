/* SPDX-License-Identifier: MIT */
/* Shared benchmark code: see bench_common.h. Nothing here is timed; the
 * helpers run between measurements, so they favour clarity over speed. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "taskorch.h"

#ifdef TKO_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

/* ---- small dynamic strings and arrays ----------------------------------- */

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) bench_die("out of memory");
  return q;
}

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(xrealloc(NULL, n), s, n);
}

static char *vformat(const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) bench_die("bad format '%s'", fmt);
  char *s = xrealloc(NULL, (size_t)n + 1);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  return s;
}

static char *format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *format(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = vformat(fmt, ap);
  va_end(ap);
  return s;
}

/* A growable array of owned strings. */
typedef struct strvec {
  char **v;
  size_t n, cap;
} strvec;

static void strvec_push(strvec *sv, char *owned) {
  if (sv->n == sv->cap) {
    sv->cap = sv->cap ? sv->cap * 2 : 8;
    sv->v = xrealloc(sv->v, sv->cap * sizeof *sv->v);
  }
  sv->v[sv->n++] = owned;
}

static void strvec_free(strvec *sv) {
  for (size_t i = 0; i < sv->n; i++)
    free(sv->v[i]);
  free(sv->v);
}

/* ---- the bench object ----------------------------------------------------- */

typedef enum cell_kind { CELL_STR, CELL_NUM, CELL_INT } cell_kind;

typedef struct cell {
  char *key;
  char *text; /* as shown in the table */
  cell_kind kind;
  double num;
  long long integer;
} cell;

typedef struct row {
  cell *cells;
  size_t n, cap;
} row;

struct bench_table {
  struct bench_impl *owner;
  char *id, *title;
  row *rows;
  size_t n, cap;
  struct bench_table *next;
};

typedef struct bench_impl {
  bench pub; /* first: bench * and bench_impl * convert both ways */
  strvec config_keys, config_values;
  strvec notes, failures;
  int passed_checks;
  char *command;
  bench_table *tables, **tables_tail;
  bool list_open; /* the configuration list was the last thing printed */
} bench_impl;

static bench_impl *impl(bench *b) {
  return (bench_impl *)b;
}

_Noreturn void bench_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("bench: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

/* ---- option parsing ------------------------------------------------------- */

static const char *prog_name = "bench";

static _Noreturn void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", prog_name);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (try --help)\n");
  va_end(ap);
  exit(2);
}

static bool parse_long(const char *s, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end) return false;
  *out = v;
  return true;
}

static bool parse_double(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v)) return false;
  *out = v;
  return true;
}

/* Stores text as opt's value, or exits 2 with one line saying why not. */
static void set_opt(const bench_opt *o, const char *text) {
  switch (o->type) {
  case BENCH_OPT_LONG: {
    long v;
    if (!parse_long(text, &v)) usage_error("--%s wants an integer, not '%s'", o->name, text);
    if (v < o->min || v > o->max)
      usage_error("--%s must be between %.0f and %.0f, not %ld", o->name, o->min, o->max, v);
    *(long *)o->value = v;
    break;
  }
  case BENCH_OPT_DOUBLE: {
    double v;
    if (!parse_double(text, &v)) usage_error("--%s wants a number, not '%s'", o->name, text);
    if (v < o->min || v > o->max)
      usage_error("--%s must be between %g and %g, not %g", o->name, o->min, o->max, v);
    *(double *)o->value = v;
    break;
  }
  case BENCH_OPT_STRING: *(const char **)o->value = text; break;
  case BENCH_OPT_LIST: {
    bench_list *l = o->value;
    l->n = 0;
    const char *p = text;
    for (;;) {
      const char *comma = strchr(p, ',');
      size_t len = comma ? (size_t)(comma - p) : strlen(p);
      char item[32];
      long v;
      if (len == 0 || len >= sizeof item) usage_error("--%s: bad list '%s'", o->name, text);
      memcpy(item, p, len);
      item[len] = 0;
      if (!parse_long(item, &v)) usage_error("--%s: '%s' is not an integer", o->name, item);
      if (v < o->min || v > o->max)
        usage_error("--%s: items must be between %.0f and %.0f, not %ld", o->name, o->min, o->max,
                    v);
      if (l->n == BENCH_LIST_MAX) usage_error("--%s: at most %d items", o->name, BENCH_LIST_MAX);
      l->v[l->n++] = v;
      if (!comma) break;
      p = comma + 1;
    }
    break;
  }
  }
}

static char *opt_value_text(const bench_opt *o) {
  switch (o->type) {
  case BENCH_OPT_LONG: return format("%ld", *(long *)o->value);
  case BENCH_OPT_DOUBLE: return format("%g", *(double *)o->value);
  case BENCH_OPT_STRING: {
    const char *s = *(const char **)o->value;
    return xstrdup(s ? s : "");
  }
  case BENCH_OPT_LIST: {
    const bench_list *l = o->value;
    char *s = xstrdup("");
    for (size_t i = 0; i < l->n; i++) {
      char *t = format("%s%s%ld", s, i ? "," : "", l->v[i]);
      free(s);
      s = t;
    }
    return s;
  }
  }
  return xstrdup("?");
}

static void print_usage(const char *name, const char *summary, const bench_opt *opts,
                        size_t nopts, long default_runs) {
  printf("usage: %s [options]\n%s\n\noptions:\n", name, summary);
  printf("  --help          this text\n");
  printf("  --smoke         tiny sizes and one run (CI uses it; checks nothing about speed)\n");
  printf("  --runs N        repetitions of each case; the median is reported (default %ld)\n",
         default_runs);
  printf("  --json FILE     also write the results as JSON to FILE\n");
  for (size_t i = 0; i < nopts; i++) {
    const bench_opt *o = &opts[i];
    const char *arg = o->type == BENCH_OPT_LIST     ? " A,B,.."
                      : o->type == BENCH_OPT_STRING ? " TEXT"
                                                    : " N";
    printf("  --%s%s\n      %s (default %s", o->name, arg, o->help, o->def);
    if (o->smoke) printf("; --smoke: %s", o->smoke);
    printf(")\n");
  }
}

/* ---- machine facts ---------------------------------------------------------- */

static char *read_first_line(const char *path, const char *prefix) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  char line[512];
  char *out = NULL;
  while (fgets(line, sizeof line, f)) {
    if (prefix && strncmp(line, prefix, strlen(prefix)) != 0) continue;
    line[strcspn(line, "\n")] = 0;
    const char *v = line;
    if (prefix) {
      v = strchr(line, ':');
      v = v ? v + 1 : line;
      while (*v == ' ' || *v == '\t')
        v++;
    }
    out = xstrdup(v);
    break;
  }
  fclose(f);
  return out;
}

static const char *build_flavour(void) {
#if defined(__SANITIZE_ADDRESS__)
  return "AddressSanitizer (timings meaningless)";
#elif defined(__SANITIZE_THREAD__)
  return "ThreadSanitizer (timings meaningless)";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return "AddressSanitizer (timings meaningless)";
#elif __has_feature(thread_sanitizer)
  return "ThreadSanitizer (timings meaningless)";
#endif
#endif
#if defined(__OPTIMIZE__)
  return "optimized";
#else
  return "not optimized (timings meaningless)";
#endif
}

/* ---- init / config / notes / checks ------------------------------------- */

/* Markdown needs a blank line between a list and what follows it. */
static void close_list(bench_impl *bi) {
  if (bi->list_open) putchar('\n');
  bi->list_open = false;
}

static void add_config(bench_impl *bi, const char *key, char *owned_value) {
  printf("- %s: %s\n", key, owned_value);
  bi->list_open = true;
  strvec_push(&bi->config_keys, xstrdup(key));
  strvec_push(&bi->config_values, owned_value);
}

bench *bench_init(int argc, char **argv, const char *name, const char *summary, bench_opt *opts,
                  size_t nopts) {
  return bench_init_runs(argc, argv, name, summary, opts, nopts, 5);
}

bench *bench_init_runs(int argc, char **argv, const char *name, const char *summary,
                       bench_opt *opts, size_t nopts, long default_runs) {
  prog_name = name;
  bench_impl *bi = xrealloc(NULL, sizeof *bi);
  memset(bi, 0, sizeof *bi);
  bi->tables_tail = &bi->tables;
  bench *b = &bi->pub;
  b->name = name;
  b->summary = summary;

  /* First pass: --help and --smoke decide which defaults apply. */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      print_usage(name, summary, opts, nopts, default_runs);
      exit(0);
    }
    if (!strcmp(argv[i], "--smoke")) b->smoke = true;
  }
  b->runs = b->smoke ? 1 : default_runs;
  for (size_t k = 0; k < nopts; k++)
    set_opt(&opts[k], b->smoke && opts[k].smoke ? opts[k].smoke : opts[k].def);

  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (!strcmp(arg, "--smoke")) continue;
    if (strncmp(arg, "--", 2) != 0) usage_error("unexpected argument '%s'", arg);
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg) - 2;
    const char *key = arg + 2;
    const char *value = eq ? eq + 1 : NULL;
#define TAKE_VALUE()                                                                               \
  do {                                                                                             \
    if (!value) {                                                                                  \
      if (i + 1 >= argc) usage_error("%.*s needs a value", (int)(len + 2), arg);                   \
      value = argv[++i];                                                                           \
    }                                                                                              \
  } while (0)
    if (len == 4 && !strncmp(key, "runs", 4)) {
      TAKE_VALUE();
      if (!parse_long(value, &b->runs) || b->runs < 1 || b->runs > 1000)
        usage_error("--runs must be an integer from 1 to 1000, not '%s'", value);
      continue;
    }
    if (len == 4 && !strncmp(key, "json", 4)) {
      TAKE_VALUE();
      if (!*value) usage_error("--json needs a file name");
      b->json = value;
      continue;
    }
    size_t k = 0;
    while (k < nopts && !(strlen(opts[k].name) == len && !strncmp(opts[k].name, key, len)))
      k++;
    if (k == nopts) usage_error("unknown option '%.*s'", (int)(len + 2), arg);
    TAKE_VALUE();
    set_opt(&opts[k], value);
#undef TAKE_VALUE
  }

  /* The command line, quoted only where needed, for the report. */
  char *cmd = xstrdup(name);
  for (int i = 1; i < argc; i++) {
    bool plain =
        argv[i][0] && strspn(argv[i], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                      "0123456789-_=.,/:+") == strlen(argv[i]);
    char *t = plain ? format("%s %s", cmd, argv[i]) : format("%s '%s'", cmd, argv[i]);
    free(cmd);
    cmd = t;
  }
  bi->command = cmd;

  printf("## %s\n\n%s\n\n", name, summary);
  struct utsname u;
  char *os = uname(&u) == 0 ? format("%s %s %s", u.sysname, u.release, u.machine) : xstrdup("?");
  char *cpu = read_first_line("/proc/cpuinfo", "model name");
  char *load = read_first_line("/proc/loadavg", NULL);
  if (load) { /* keep the three load averages only */
    char *p = load;
    for (int f = 0; f < 3 && p; f++)
      p = strchr(p + (f ? 1 : 0), ' ');
    if (p) *p = 0;
  }
  time_t now = time(NULL);
  char date[64];
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  printf("- command: `%s`\n", cmd); /* the JSON has it as "command" */
  add_config(bi, "date", xstrdup(date));
  add_config(bi, "machine",
             format("%s, %s, %u CPUs online", os, cpu ? cpu : "unknown CPU", bench_cpus()));
  add_config(bi, "load average at start", xstrdup(load ? load : "?"));
  add_config(bi, "build", format("%s, %s", build_flavour(), __VERSION__));
  add_config(bi, "taskorch", xstrdup(tko_version_string()));
  add_config(bi, "allocator", xstrdup(bench_allocator_name()));
  add_config(bi, "runs per case", format("%ld%s", b->runs, b->runs > 1 ? " (median shown)" : ""));
  if (b->smoke) add_config(bi, "smoke", xstrdup("yes: tiny sizes, numbers mean nothing"));
  for (size_t k = 0; k < nopts; k++)
    add_config(bi, opts[k].name, opt_value_text(&opts[k]));
  free(os);
  free(cpu);
  free(load);
  fflush(stdout);
  return b;
}

void bench_config(bench *b, const char *key, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  add_config(impl(b), key, vformat(fmt, ap));
  va_end(ap);
  fflush(stdout);
}

void bench_note(bench *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = vformat(fmt, ap);
  va_end(ap);
  close_list(impl(b));
  printf("%s\n\n", s);
  fflush(stdout);
  strvec_push(&impl(b)->notes, s);
}

bool bench_check(bench *b, bool ok, const char *fmt, ...) {
  bench_impl *bi = impl(b);
  if (ok) {
    bi->passed_checks++;
    return true;
  }
  va_list ap;
  va_start(ap, fmt);
  char *s = vformat(fmt, ap);
  va_end(ap);
  close_list(bi);
  printf("**CHECK FAILED**: %s\n\n", s);
  fprintf(stderr, "%s: check failed: %s\n", b->name, s);
  fflush(stdout);
  strvec_push(&bi->failures, s);
  b->failed_checks++;
  return false;
}

/* ---- tables --------------------------------------------------------------- */

bench_table *bench_table_new(bench *b, const char *id, const char *title) {
  bench_impl *bi = impl(b);
  bench_table *t = xrealloc(NULL, sizeof *t);
  memset(t, 0, sizeof *t);
  t->owner = bi;
  t->id = xstrdup(id);
  t->title = xstrdup(title);
  *bi->tables_tail = t;
  bi->tables_tail = &t->next;
  return t;
}

void bench_row(bench_table *t) {
  if (t->n == t->cap) {
    t->cap = t->cap ? t->cap * 2 : 8;
    t->rows = xrealloc(t->rows, t->cap * sizeof *t->rows);
  }
  t->rows[t->n++] = (row){0};
}

static cell *new_cell(bench_table *t, const char *key) {
  if (!t->n) bench_row(t);
  row *r = &t->rows[t->n - 1];
  if (r->n == r->cap) {
    r->cap = r->cap ? r->cap * 2 : 8;
    r->cells = xrealloc(r->cells, r->cap * sizeof *r->cells);
  }
  cell *c = &r->cells[r->n++];
  *c = (cell){.key = xstrdup(key)};
  return c;
}

void bench_cell_str(bench_table *t, const char *key, const char *fmt, ...) {
  cell *c = new_cell(t, key);
  va_list ap;
  va_start(ap, fmt);
  c->text = vformat(fmt, ap);
  va_end(ap);
  c->kind = CELL_STR;
}

void bench_cell_num(bench_table *t, const char *key, const char *fmt, double v) {
  cell *c = new_cell(t, key);
  c->text = isfinite(v) ? format(fmt, v) : xstrdup("-");
  c->kind = CELL_NUM;
  c->num = v;
}

void bench_cell_int(bench_table *t, const char *key, long long v) {
  cell *c = new_cell(t, key);
  c->text = format("%lld", v);
  c->kind = CELL_INT;
  c->integer = v;
}

/* Column keys in order of first appearance. */
static size_t table_columns(const bench_table *t, const char ***keys_out, bool **numeric_out) {
  const char **keys = NULL;
  bool *numeric = NULL;
  size_t n = 0;
  for (size_t r = 0; r < t->n; r++) {
    for (size_t c = 0; c < t->rows[r].n; c++) {
      const cell *ce = &t->rows[r].cells[c];
      size_t k = 0;
      while (k < n && strcmp(keys[k], ce->key) != 0)
        k++;
      if (k < n) {
        /* A column is numeric if any of its cells is ("-" fills gaps). */
        numeric[k] = numeric[k] || ce->kind != CELL_STR;
        continue;
      }
      keys = xrealloc(keys, (n + 1) * sizeof *keys);
      numeric = xrealloc(numeric, (n + 1) * sizeof *numeric);
      keys[n] = ce->key;
      numeric[n] = ce->kind != CELL_STR;
      n++;
    }
  }
  *keys_out = keys;
  *numeric_out = numeric;
  return n;
}

static const cell *find_cell(const row *r, const char *key) {
  for (size_t c = 0; c < r->n; c++)
    if (!strcmp(r->cells[c].key, key)) return &r->cells[c];
  return NULL;
}

/* Display width: counts UTF-8 characters, not bytes, so "µs" lines up. */
static size_t text_width(const char *s) {
  size_t w = 0;
  for (; *s; s++)
    if (((unsigned char)*s & 0xC0) != 0x80) w++;
  return w;
}

static void print_padded(const char *s, size_t width, bool right) {
  size_t w = text_width(s);
  if (right)
    for (size_t i = w; i < width; i++)
      putchar(' ');
  fputs(s, stdout);
  if (!right)
    for (size_t i = w; i < width; i++)
      putchar(' ');
}

void bench_table_print(bench_table *t) {
  const char **keys;
  bool *numeric;
  size_t nc = table_columns(t, &keys, &numeric);
  size_t *width = xrealloc(NULL, (nc ? nc : 1) * sizeof *width);
  for (size_t k = 0; k < nc; k++) {
    width[k] = text_width(keys[k]);
    if (width[k] < 3) width[k] = 3; /* room for the "--:" rule */
    for (size_t r = 0; r < t->n; r++) {
      const cell *c = find_cell(&t->rows[r], keys[k]);
      if (c && text_width(c->text) > width[k]) width[k] = text_width(c->text);
    }
  }
  close_list(t->owner);
  printf("### %s\n\n", t->title);
  fputs("|", stdout);
  for (size_t k = 0; k < nc; k++) {
    putchar(' ');
    print_padded(keys[k], width[k], numeric[k]);
    fputs(" |", stdout);
  }
  fputs("\n|", stdout);
  for (size_t k = 0; k < nc; k++) {
    /* Markdown alignment: numbers right, text left. */
    putchar(numeric[k] ? '-' : ':');
    for (size_t i = 0; i < width[k]; i++)
      putchar('-');
    fputs(numeric[k] ? ":|" : "-|", stdout);
  }
  putchar('\n');
  for (size_t r = 0; r < t->n; r++) {
    fputs("|", stdout);
    for (size_t k = 0; k < nc; k++) {
      const cell *c = find_cell(&t->rows[r], keys[k]);
      putchar(' ');
      print_padded(c ? c->text : "", width[k], numeric[k]);
      fputs(" |", stdout);
    }
    putchar('\n');
  }
  putchar('\n');
  fflush(stdout);
  free(width);
  free(keys);
  free(numeric);
}

/* ---- JSON ----------------------------------------------------------------- */

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch == '\n')
      fputs("\\n", f);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

static void json_strvec(FILE *f, const strvec *sv) {
  fputc('[', f);
  for (size_t i = 0; i < sv->n; i++) {
    if (i) fputs(", ", f);
    json_str(f, sv->v[i]);
  }
  fputc(']', f);
}

static int write_json(bench_impl *bi) {
  const char *path = bi->pub.json;
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "%s: cannot write %s: %s\n", bi->pub.name, path, strerror(errno));
    return -1;
  }
  fputs("{\n  \"benchmark\": ", f);
  json_str(f, bi->pub.name);
  fputs(",\n  \"summary\": ", f);
  json_str(f, bi->pub.summary);
  fputs(",\n  \"command\": ", f);
  json_str(f, bi->command);
  fprintf(f, ",\n  \"smoke\": %s,\n  \"runs\": %ld,\n  \"config\": {",
          bi->pub.smoke ? "true" : "false", bi->pub.runs);
  for (size_t i = 0; i < bi->config_keys.n; i++) {
    fputs(i ? ",\n    " : "\n    ", f);
    json_str(f, bi->config_keys.v[i]);
    fputs(": ", f);
    json_str(f, bi->config_values.v[i]);
  }
  fputs("\n  },\n  \"tables\": [", f);
  bool first_table = true;
  for (bench_table *t = bi->tables; t; t = t->next) {
    fputs(first_table ? "\n    {\"id\": " : ",\n    {\"id\": ", f);
    first_table = false;
    json_str(f, t->id);
    fputs(", \"title\": ", f);
    json_str(f, t->title);
    fputs(", \"rows\": [", f);
    for (size_t r = 0; r < t->n; r++) {
      fputs(r ? ",\n      {" : "\n      {", f);
      for (size_t c = 0; c < t->rows[r].n; c++) {
        const cell *ce = &t->rows[r].cells[c];
        if (c) fputs(", ", f);
        json_str(f, ce->key);
        fputs(": ", f);
        if (ce->kind == CELL_STR)
          json_str(f, ce->text);
        else if (ce->kind == CELL_INT)
          fprintf(f, "%lld", ce->integer);
        else if (isfinite(ce->num))
          fprintf(f, "%.17g", ce->num);
        else
          fputs("null", f);
      }
      fputc('}', f);
    }
    fputs(t->n ? "\n    ]}" : "]}", f);
  }
  fputs("\n  ],\n  \"notes\": ", f);
  json_strvec(f, &bi->notes);
  fprintf(f, ",\n  \"checks_passed\": %d,\n  \"checks_failed\": ", bi->passed_checks);
  json_strvec(f, &bi->failures);
  fputs("\n}\n", f);
  if (fclose(f) != 0) {
    fprintf(stderr, "%s: cannot write %s: %s\n", bi->pub.name, path, strerror(errno));
    return -1;
  }
  return 0;
}

int bench_finish(bench *b) {
  bench_impl *bi = impl(b);
  int status = b->failed_checks ? 1 : 0;
  close_list(bi);
  if (bi->passed_checks || b->failed_checks)
    printf("checks: %d passed, %d failed\n\n", bi->passed_checks, b->failed_checks);
  fflush(stdout);
  if (b->json && write_json(bi) != 0) status = 1;
  for (bench_table *t = bi->tables, *next; t; t = next) {
    next = t->next;
    for (size_t r = 0; r < t->n; r++) {
      for (size_t c = 0; c < t->rows[r].n; c++) {
        free(t->rows[r].cells[c].key);
        free(t->rows[r].cells[c].text);
      }
      free(t->rows[r].cells);
    }
    free(t->rows);
    free(t->id);
    free(t->title);
    free(t);
  }
  strvec_free(&bi->config_keys);
  strvec_free(&bi->config_values);
  strvec_free(&bi->notes);
  strvec_free(&bi->failures);
  free(bi->command);
  free(bi);
  return status;
}

/* ---- time and statistics ---------------------------------------------------- */

uint64_t bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t bench_process_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void bench_sleep_ns(uint64_t ns) {
  struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(double *v, size_t n) {
  if (!n) return NAN;
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double bench_percentile(double *v, size_t n, double p) {
  if (!n) return NAN;
  qsort(v, n, sizeof *v, cmp_double);
  /* Nearest rank: the smallest value with at least p% of samples at or below. */
  double rank = ceil(p / 100.0 * (double)n);
  size_t i = rank < 1 ? 0 : (size_t)rank - 1;
  return v[i < n ? i : n - 1];
}

double bench_min(const double *v, size_t n) {
  double m = n ? v[0] : NAN;
  for (size_t i = 1; i < n; i++)
    if (v[i] < m) m = v[i];
  return m;
}

double bench_max(const double *v, size_t n) {
  double m = n ? v[0] : NAN;
  for (size_t i = 1; i < n; i++)
    if (v[i] > m) m = v[i];
  return m;
}

/* ---- calibrated busy work ----------------------------------------------------- */

/* Never inlined, and its result goes through an empty asm statement the
 * compiler must assume reads it: a task that drops the result still does
 * the work, also where link-time optimisation (TKO_LTO) sees the whole
 * program and would otherwise delete a call whose result is unused. */
__attribute__((noinline)) uint64_t bench_work(uint64_t iters, uint64_t seed) {
  uint64_t x = seed | 1;
  for (uint64_t i = 0; i < iters; i++) {
    /* xorshift64*: each step depends on the last, so nothing overlaps. */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    x *= 0x2545F4914F6CDD1DULL;
  }
  __asm__ volatile("" : : "r"(x) : "memory");
  return x;
}

static double work_ns_per_iter;

double bench_work_calibrate(void) {
  if (work_ns_per_iter > 0) return work_ns_per_iter;
  const uint64_t iters = 100000;
  volatile uint64_t sink = 0;
  double best = INFINITY;
  for (int trial = 0; trial < 15; trial++) {
    uint64_t t0 = bench_now_ns();
    sink += bench_work(iters, (uint64_t)trial + 1);
    double ns = (double)(bench_now_ns() - t0) / (double)iters;
    if (ns < best) best = ns;
  }
  (void)sink;
  work_ns_per_iter = best > 0 ? best : 1.0;
  return work_ns_per_iter;
}

uint64_t bench_work_iters(double ns) {
  double it = ns / bench_work_calibrate();
  return it < 1 ? 1 : (uint64_t)(it + 0.5);
}

/* ---- threads ------------------------------------------------------------------ */

unsigned bench_cpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (unsigned)n : 1u;
}

/* Counts this process's threads and, of those other than the caller, the
 * ones the kernel shows running or runnable ('R'). */
static unsigned scan_threads(unsigned *awake) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return 0;
  pid_t self = gettid();
  unsigned total = 0;
  *awake = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    total++;
    if (atoi(e->d_name) == self) continue;
    char path[300], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue; /* the thread just exited */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* The state follows the last ')', after the command name. */
    char *p = strrchr(buf, ')');
    if (p && p[1] == ' ' && p[2] == 'R') (*awake)++;
  }
  closedir(d);
  return total;
}

bool bench_wait_others_asleep(long timeout_ms) {
  uint64_t deadline = bench_now_ns() + (uint64_t)timeout_ms * 1000000u;
  for (;;) {
    unsigned awake;
    if (scan_threads(&awake) == 0) return false; /* no /proc: cannot tell */
    if (awake == 0) return true;
    if (bench_now_ns() >= deadline) return false;
    bench_sleep_ns(100000);
  }
}

/* The "Threads:" line of /proc/self/status, read with open and read: no
 * malloc (opendir and fopen allocate), so bench_alloc may count threads
 * between its allocator snapshots. */
unsigned bench_thread_count(void) {
  int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char *p = strstr(buf, "\nThreads:");
  return p ? (unsigned)strtoul(p + strlen("\nThreads:"), NULL, 10) : 0;
}

bool bench_wait_thread_count(unsigned n, long timeout_ms) {
  uint64_t deadline = bench_now_ns() + (uint64_t)timeout_ms * 1000000u;
  for (;;) {
    unsigned total = bench_thread_count();
    if (total == 0) return false;
    if (total <= n) return true;
    if (bench_now_ns() >= deadline) return false;
    bench_sleep_ns(100000);
  }
}

/* ---- elastic retirement ----------------------------------------------------- */

static void retire_watch_hook(void *user, unsigned index, tko_worker_kind kind) {
  (void)index;
  if (kind != TKO_WORKER_ELASTIC) return;
  bench_retire_watch *w = user;
  pthread_mutex_lock(&w->mu);
  w->stops++;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

void bench_retire_watch_init(bench_retire_watch *w, tko_options *o) {
  pthread_mutex_init(&w->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->cv, &ca);
  pthread_condattr_destroy(&ca);
  w->stops = 0;
  o->hooks.user = w;
  o->hooks.thread_stop = retire_watch_hook;
}

bool bench_retire_wait(bench_retire_watch *w, tko_pool *pool, long timeout_ms) {
  uint64_t deadline = bench_now_ns() + (uint64_t)timeout_ms * 1000000u;
  struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000u),
                        .tv_nsec = (long)(deadline % 1000000000u)};
  bool ok = true;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    /* A retiring worker's stats change before its thread_stop hook runs,
     * and the hook counts the stop and broadcasts under mu. So a check that
     * fails here, under mu, is made again after that hook: no lost wake-up. */
    tko_stats st;
    tko_pool_stats(pool, &st);
    if (st.elastic_workers == 0 && w->stops >= st.elastic_spawned) break;
    if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT) {
      tko_pool_stats(pool, &st);
      ok = st.elastic_workers == 0 && w->stops >= st.elastic_spawned;
      break;
    }
  }
  pthread_mutex_unlock(&w->mu);
  return ok;
}

void bench_retire_watch_destroy(bench_retire_watch *w) {
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
}

/* ---- memory ------------------------------------------------------------------- */

uint64_t bench_rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  int n = fscanf(f, "%lu %lu", &size, &resident);
  fclose(f);
  return n == 2 ? (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

#ifdef TKO_HAVE_JEMALLOC
static int jemalloc_state = -1; /* -1 unknown, 0 inactive, 1 active */

bool bench_jemalloc_active(void) {
  if (jemalloc_state >= 0) return jemalloc_state;
  /* thread.allocated counts this thread's allocations exactly; if a malloc
   * does not move it, some other allocator (a sanitizer's) serves malloc. */
  uint64_t before = 0, after = 0;
  size_t sz = sizeof before;
  jemalloc_state = 0;
  if (mallctl("thread.allocated", &before, &sz, NULL, 0) != 0) return false;
  void *volatile p = malloc(4096);
  sz = sizeof after;
  int rc = mallctl("thread.allocated", &after, &sz, NULL, 0);
  free(p);
  jemalloc_state = rc == 0 && after >= before + 4096;
  return jemalloc_state;
}

static uint64_t ctl_u64(const char *name) {
  uint64_t v = 0;
  size_t sz = sizeof v;
  if (mallctl(name, &v, &sz, NULL, 0) != 0) return 0;
  return v;
}

static size_t ctl_size(const char *name) {
  size_t v = 0, sz = sizeof v;
  if (mallctl(name, &v, &sz, NULL, 0) != 0) return 0;
  return v;
}

static unsigned ctl_unsigned(const char *name) {
  unsigned v = 0;
  size_t sz = sizeof v;
  if (mallctl(name, &v, &sz, NULL, 0) != 0) return 0;
  return v;
}

#define BENCH_STR_(x) #x
#define BENCH_STR(x) BENCH_STR_(x)
#define ARENAS_ALL "stats.arenas." BENCH_STR(MALLCTL_ARENAS_ALL)

bool bench_jemalloc_snapshot(bench_mem *out) {
  *out = (bench_mem){0};
  if (!bench_jemalloc_active()) return false;
  /* Writing the epoch makes jemalloc merge its per-arena statistics. */
  uint64_t epoch = 1;
  size_t sz = sizeof epoch;
  if (mallctl("epoch", &epoch, &sz, &epoch, sizeof epoch) != 0) return false;
  out->nmalloc = ctl_u64(ARENAS_ALL ".small.nmalloc") + ctl_u64(ARENAS_ALL ".large.nmalloc");
  out->live = ctl_size("stats.allocated");
  /* Cumulative bytes: allocations per size class times the class size. */
  char name[96];
  unsigned nbins = ctl_unsigned("arenas.nbins");
  for (unsigned j = 0; j < nbins; j++) {
    snprintf(name, sizeof name, "arenas.bin.%u.size", j);
    size_t size = ctl_size(name);
    snprintf(name, sizeof name, ARENAS_ALL ".bins.%u.nmalloc", j);
    out->bytes += ctl_u64(name) * size;
  }
  unsigned nlextents = ctl_unsigned("arenas.nlextents");
  for (unsigned j = 0; j < nlextents; j++) {
    snprintf(name, sizeof name, ARENAS_ALL ".lextents.%u.nmalloc", j);
    uint64_t n = ctl_u64(name);
    if (!n) continue;
    snprintf(name, sizeof name, "arenas.lextent.%u.size", j);
    out->bytes += n * ctl_size(name);
  }
  return true;
}

void bench_jemalloc_purge(void) {
  if (bench_jemalloc_active())
    mallctl("arena." BENCH_STR(MALLCTL_ARENAS_ALL) ".purge", NULL, NULL, NULL, 0);
}

const char *bench_allocator_name(void) {
  static char buf[128];
  const char *version = NULL;
  size_t sz = sizeof version;
  if (mallctl("version", &version, &sz, NULL, 0) != 0 || !version) version = "?";
  size_t len = strcspn(version, "-");
  bool tcache = false;
  sz = sizeof tcache;
  mallctl("opt.tcache", &tcache, &sz, NULL, 0);
  snprintf(buf, sizeof buf, "jemalloc %.*s (%s%s)", (int)len, version,
           bench_jemalloc_active() ? "active"
                                   : "linked but inactive: a sanitizer's allocator serves malloc",
           bench_jemalloc_active() && !tcache ? ", thread caches off" : "");
  return buf;
}
#else
bool bench_jemalloc_active(void) {
  return false;
}
void bench_jemalloc_purge(void) {}
bool bench_jemalloc_snapshot(bench_mem *out) {
  *out = (bench_mem){0};
  return false;
}
const char *bench_allocator_name(void) {
  return "the C library's malloc (jemalloc not linked)";
}
#endif
