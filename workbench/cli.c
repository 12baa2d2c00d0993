/* SPDX-License-Identifier: MIT */
/* Command-line options of `taskorch-workbench run`: one table drives parsing,
 * checking and --help, so a new option is one row plus a wb_config field.
 *
 * Parsing has two passes. The first reads every option into a scratch
 * wb_config and notes which ones were given; the second starts from the
 * scenario's defaults and copies over just the given fields, then checks the
 * combination. Every error is one line on stderr naming the problem, with a
 * hint, and exit status 2, before anything is started or written. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "wb.h"

typedef enum wb_opt_type {
  OPT_FLAG,      /* bool, takes no value */
  OPT_UINT,      /* unsigned, in [min, max] */
  OPT_U64,       /* uint64_t, in [min, max]; decimal or 0x hex */
  OPT_LONG,      /* long, in [min, max] */
  OPT_PCT,       /* double percentage, 0..100 */
  OPT_RANGE,     /* wb_range, "LO:HI" (or "N" for N:N), any int */
  OPT_POOL,      /* wb_pool_kind, "basic" or "elastic" */
  OPT_PATH,      /* const char *, an output file */
  OPT_SCENARIO,  /* const wb_scenario *, by name */
  OPT_FULL,      /* tko_full_policy, "block", "reject" or "caller" */
  OPT_RESIZE,    /* wb_resize, "B:E" */
  OPT_NAME       /* const char *, a thread name prefix */
} wb_opt_type;

typedef struct wb_option {
  const char *name;     /* without the leading "--" */
  const char *metavar;  /* NULL for flags */
  wb_opt_type type;
  size_t offset;        /* of the field in wb_config */
  uint64_t min, max;    /* bounds for the integer types */
  const char *help;
} wb_option;

#define FIELD(f) offsetof(wb_config, f)

/* Later features (lanes, coalescer) add rows here. */
static const wb_option options[] = {
    {"scenario", "NAME", OPT_SCENARIO, FIELD(scenario), 0, 0,
     "scenario to run (required; `list` shows them)"},
    {"pool", "KIND", OPT_POOL, FIELD(pool), 0, 0, "basic or elastic"},
    {"workers", "N", OPT_UINT, FIELD(workers), 0, TKO_MAX_WORKERS,
     "basic workers (0 = elastic workers only)"},
    {"max-elastic", "N", OPT_UINT, FIELD(max_elastic), 0, TKO_MAX_ELASTIC,
     "most elastic workers (elastic pools)"},
    {"idle-ms", "MS", OPT_UINT, FIELD(idle_ms), 1, TKO_MAX_IDLE_MS,
     "elastic worker idle timeout (elastic pools)"},
    {"tasks", "N", OPT_U64, FIELD(tasks), 1, WB_MAX_TASKS, "tasks in all"},
    {"producers", "N", OPT_UINT, FIELD(producers), 1, WB_MAX_PRODUCERS,
     "threads submitting tasks"},
    {"weights", "LO:HI", OPT_RANGE, FIELD(weights), 0, 0,
     "task weights, uniform in LO..HI (higher runs first); W alone is W:W"},
    {"task-us", "US", OPT_UINT, FIELD(task_us), 0, WB_MAX_WORK_MS * 1000u,
     "CPU work per CPU-bound task, microseconds (varies 0.5x-1.5x)"},
    {"io-ms", "MS", OPT_UINT, FIELD(io_ms), 0, WB_MAX_WORK_MS,
     "sleep per blocking task, milliseconds (varies 0.5x-1.5x)"},
    {"io-pct", "P", OPT_PCT, FIELD(io_pct), 0, 0, "percent of tasks that block"},
    {"fail-pct", "P", OPT_PCT, FIELD(fail_pct), 0, 0,
     "percent of tasks that return a failure status"},
    {"bursts", "N", OPT_UINT, FIELD(bursts), 1, WB_MAX_BURSTS,
     "submit the tasks in N floods..."},
    {"gap-ms", "MS", OPT_UINT, FIELD(gap_ms), 0, 600000,
     "...each after the pool has idled MS"},
    {"tail-ms", "MS", OPT_LONG, FIELD(tail_ms), 0, 600000,
     "idle time after the last task (default: elastic idle + 150 ms)"},
    {"seed", "N", OPT_U64, FIELD(seed), 0, UINT64_MAX,
     "task mix seed (decimal, or hex with 0x); the same seed gives the same mix"},
    {"groups", "N", OPT_UINT, FIELD(groups), 1, 1000000,
     "submit in task groups of N and wait for each group"},
    {"handles", "N", OPT_UINT, FIELD(handles), 1, 1000000,
     "submit through task handles (tko_submit_handle), N at a time, and wait for each"},
    {"cancel-pct", "P", OPT_PCT, FIELD(cancel_pct), 0, 0,
     "percent of handle tasks cancelled once their N are submitted (needs --handles)"},
    {"batch", "N", OPT_UINT, FIELD(batch), 1, 1000000,
     "submit in batches of N (tko_submit_batch)"},
    {"capacity", "N", OPT_U64, FIELD(capacity), 1, UINT64_C(1) << 31,
     "bounded queue: at most N tasks queued"},
    {"full", "POLICY", OPT_FULL, FIELD(full), 0, 0,
     "full bounded queue: block, reject (producers retry) or caller (runs it)"},
    {"aging-ms", "MS", OPT_UINT, FIELD(aging_ms), 1, TKO_MAX_IDLE_MS,
     "aging: a queued task gains one weight unit per MS waited"},
    {"blocking-hint", NULL, OPT_FLAG, FIELD(blocking_hint), 0, 0,
     "blocking tasks call tko_blocking_begin/end around their sleep"},
    {"delay-ms", "MS", OPT_UINT, FIELD(delay_ms), 1, 60000,
     "submit every task through a timer that fires MS later"},
    {"async", NULL, OPT_FLAG, FIELD(async), 0, 0,
     "blocking tasks run as async tasks, completed by a completer thread"},
    {"max-async", "N", OPT_UINT, FIELD(max_async), 1, 1000000,
     "most async tasks in flight at once (needs --async)"},
    {"resize", "B:E", OPT_RESIZE, FIELD(resize), 0, 0,
     "halfway through the submissions, resize the pool to B basic + up to E elastic"},
    {"thread-name", "PREFIX", OPT_NAME, FIELD(thread_name), 0, 0,
     "pool thread name prefix (tko_options.name; default wb)"},
    {"quiet", NULL, OPT_FLAG, FIELD(quiet), 0, 0, "no progress bar"},
    {"json", "FILE", OPT_PATH, FIELD(json_path), 0, 0,
     "write the summary as JSON (- = stdout; the table then goes to stderr)"},
    {"timeline", "FILE.csv", OPT_PATH, FIELD(timeline_path), 0, 0,
     "write pool samples as CSV (1 ms apart, wider as the run goes on)"},
    {"plot", "FILE.svg", OPT_PATH, FIELD(plot_path), 0, 0,
     "draw the timeline and latency by weight as SVG"},
};
#define NOPTIONS (sizeof options / sizeof options[0])
_Static_assert(NOPTIONS <= 64, "the given-mask is one uint64_t");

static uint64_t bit_of(const char *name) {
  for (size_t i = 0; i < NOPTIONS; i++)
    if (!strcmp(options[i].name, name)) return UINT64_C(1) << i;
  return 0;
}

static size_t size_of(wb_opt_type t) {
  switch (t) {
    case OPT_FLAG: return sizeof(bool);
    case OPT_UINT: return sizeof(unsigned);
    case OPT_U64: return sizeof(uint64_t);
    case OPT_LONG: return sizeof(long);
    case OPT_PCT: return sizeof(double);
    case OPT_RANGE: return sizeof(wb_range);
    case OPT_POOL: return sizeof(wb_pool_kind);
    case OPT_PATH: return sizeof(const char *);
    case OPT_SCENARIO: return sizeof(const wb_scenario *);
    case OPT_FULL: return sizeof(tko_full_policy);
    case OPT_RESIZE: return sizeof(wb_resize);
    case OPT_NAME: return sizeof(const char *);
  }
  return 0;
}

/* Prints the one-line error with its hint; returns the usage exit status. */
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", WB_PROG);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (see '%s run --help')\n", WB_PROG);
  va_end(ap);
  return WB_EXIT_USAGE;
}

/* Parses an unsigned integer; base 16 allows 0x hex (for seeds), base 10
 * digits only. */
static int parse_u64(const wb_option *o, const char *s, int base, uint64_t *out) {
  char q[WB_QUOTE_MAX];
  wb_quote(q, sizeof q, s);
  if (s[0] == '-' && s[1] >= '0' && s[1] <= '9')
    return usage_error("--%s must not be negative (got '%s')", o->name, q);
  if (!(s[0] >= '0' && s[0] <= '9'))
    return usage_error("--%s: '%s' is not a number", o->name, q);
  bool hex = base == 16 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
  if (hex && !isxdigit((unsigned char)s[2]))
    return usage_error("--%s: '%s' is not a number", o->name, q);
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, hex ? 16 : 10);
  if (*end) return usage_error("--%s: '%s' is not a number", o->name, q);
  if (errno == ERANGE || v > o->max)
    return usage_error("--%s must be at most %" PRIu64 " (got '%s')", o->name, o->max, q);
  if (v < o->min)
    return usage_error("--%s must be at least %" PRIu64 " (got '%s')", o->name, o->min, q);
  *out = v;
  return 0;
}

/* Parses one int of a weight range; *end is where it stopped. */
static bool parse_int(const char *s, int *out, const char **end) {
  char *e;
  errno = 0;
  if (!((s[0] >= '0' && s[0] <= '9') || (s[0] == '-' && s[1] >= '0' && s[1] <= '9')))
    return false;
  long v = strtol(s, &e, 10);
  if (errno == ERANGE || v < INT32_MIN || v > INT32_MAX) return false;
  *out = (int)v;
  *end = e;
  return true;
}

static int parse_value(const wb_option *o, const char *v, wb_config *user) {
  void *field = (char *)user + o->offset;
  uint64_t u;
  int rc;
  char q[WB_QUOTE_MAX]; /* v as the error lines below echo it */
  if (v) wb_quote(q, sizeof q, v);
  switch (o->type) {
    case OPT_FLAG:
      *(bool *)field = true;
      return 0;
    case OPT_UINT:
      if ((rc = parse_u64(o, v, 10, &u))) return rc;
      *(unsigned *)field = (unsigned)u;
      return 0;
    case OPT_U64:
      if ((rc = parse_u64(o, v, o->max == UINT64_MAX ? 16 : 10, &u))) return rc;
      *(uint64_t *)field = u;
      return 0;
    case OPT_LONG:
      if ((rc = parse_u64(o, v, 10, &u))) return rc;
      *(long *)field = (long)u;
      return 0;
    case OPT_PCT: {
      /* Decimal digits with at most one point: strtod alone would take
       * 0x10, 1e1 and -0 too. */
      if (v[0] == '-') return usage_error("--%s must not be negative (got '%s')", o->name, q);
      size_t digits = strspn(v, "0123456789"), point = v[digits] == '.';
      size_t fraction = strspn(v + digits + point, "0123456789");
      if (digits + fraction == 0 || v[digits + point + fraction])
        return usage_error("--%s: '%s' is not a number", o->name, q);
      double d = strtod(v, NULL);
      if (d > 100) return usage_error("--%s is a percentage, at most 100 (got '%s')", o->name, q);
      *(double *)field = d;
      return 0;
    }
    case OPT_RANGE: {
      wb_range r;
      const char *end;
      if (!parse_int(v, &r.lo, &end))
        return usage_error("--%s: '%s' is not LO:HI with integers LO and HI", o->name, q);
      if (*end == '\0') {
        r.hi = r.lo;
      } else if (*end != ':' || !parse_int(end + 1, &r.hi, &end) || *end) {
        return usage_error("--%s: '%s' is not LO:HI with integers LO and HI", o->name, q);
      }
      if (r.lo > r.hi)
        return usage_error("--%s: weight range %d:%d is backwards (LO must be <= HI)", o->name,
                           r.lo, r.hi);
      *(wb_range *)field = r;
      return 0;
    }
    case OPT_POOL:
      if (!strcmp(v, "basic")) {
        *(wb_pool_kind *)field = WB_POOL_BASIC;
      } else if (!strcmp(v, "elastic")) {
        *(wb_pool_kind *)field = WB_POOL_ELASTIC;
      } else {
        return usage_error("--%s must be basic or elastic (got '%s')", o->name, q);
      }
      return 0;
    case OPT_PATH:
      if (!*v) return usage_error("--%s needs a file name", o->name);
      *(const char **)field = v;
      return 0;
    case OPT_NAME:
      /* The library takes "" and names its threads "-b0", "-e1": refused
       * here, so a name is either given or left to the default. */
      if (!*v) return usage_error("--%s must not be empty", o->name);
      *(const char **)field = v;
      return 0;
    case OPT_SCENARIO: {
      const wb_scenario *s = wb_scenario_find(v);
      if (!s)
        return usage_error("unknown scenario '%s'; '%s list' shows them", q, WB_PROG);
      *(const wb_scenario **)field = s;
      return 0;
    }
    case OPT_FULL:
      if (!strcmp(v, "block")) {
        *(tko_full_policy *)field = TKO_FULL_BLOCK;
      } else if (!strcmp(v, "reject")) {
        *(tko_full_policy *)field = TKO_FULL_REJECT;
      } else if (!strcmp(v, "caller")) {
        *(tko_full_policy *)field = TKO_FULL_CALLER_RUNS;
      } else {
        return usage_error("--%s must be block, reject or caller (got '%s')", o->name, q);
      }
      return 0;
    case OPT_RESIZE: {
      wb_resize r = {true, 0, 0};
      char *end;
      errno = 0;
      unsigned long b = v[0] >= '0' && v[0] <= '9' ? strtoul(v, &end, 10) : ULONG_MAX;
      unsigned long e = b != ULONG_MAX && *end == ':' && end[1] >= '0' && end[1] <= '9'
                            ? strtoul(end + 1, &end, 10)
                            : ULONG_MAX;
      if (e == ULONG_MAX || *end || errno)
        return usage_error("--%s: '%s' is not B:E (basic workers, most elastic workers)",
                           o->name, q);
      if (b > TKO_MAX_WORKERS || e > TKO_MAX_ELASTIC)
        return usage_error("--%s: at most %u basic and %u elastic workers (got '%s')", o->name,
                           TKO_MAX_WORKERS, TKO_MAX_ELASTIC, q);
      if (b + e == 0)
        return usage_error("--%s 0:0 would leave the pool no workers at all", o->name);
      r.basic = (unsigned)b;
      r.max_elastic = (unsigned)e;
      *(wb_resize *)field = r;
      return 0;
    }
  }
  return usage_error("--%s: internal error", o->name);
}

void wb_cli_usage(FILE *f) {
  fprintf(f,
          "usage: %s run --scenario NAME [options]   run a scenario and print a summary\n"
          "       %s list                           describe the scenarios\n"
          "       %s --help | --version (-V)\n"
          "\n"
          "run options (defaults come from the scenario; see `list`):\n",
          WB_PROG, WB_PROG, WB_PROG);
  for (size_t i = 0; i < NOPTIONS; i++) {
    char left[40];
    snprintf(left, sizeof left, "--%s%s%s", options[i].name, options[i].metavar ? " " : "",
             options[i].metavar ? options[i].metavar : "");
    fprintf(f, "  %-22s %s\n", left, options[i].help);
  }
  fprintf(f,
          "\nOptions also take the form --name=VALUE. A progress line is drawn on stderr\n"
          "when it is a terminal. Bad input exits with status 2 and starts nothing.\n"
          "An output FILE may be - (standard output) for one of them; files are replaced\n"
          "only when the run finishes. Ctrl-C stops the run: the queued tasks are\n"
          "cancelled, the summary covers what ran, no file is written, status 130.\n");
}

static bool same_inode(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

/* The folder part of path ("." for a bare name), into buf; false if too long. */
static bool folder_of(const char *path, char *buf, size_t len) {
  const char *slash = strrchr(path, '/');
  if (!slash) return snprintf(buf, len, ".") < (int)len;
  size_t n = slash == path ? 1 : (size_t)(slash - path); /* "/name": the root */
  if (n >= len) return false;
  memcpy(buf, path, n);
  buf[n] = '\0';
  return true;
}

/* The same name, two names of one existing file, or one name in one folder
 * spelled two ways ("out/a.json", "./out//a.json") for a file that does
 * not exist yet. */
static bool same_file(const char *a, const char *b) {
  if (!strcmp(a, b) || same_inode(a, b)) return true;
  const char *na = strrchr(a, '/'), *nb = strrchr(b, '/');
  if (strcmp(na ? na + 1 : a, nb ? nb + 1 : b) != 0) return false;
  char da[PATH_MAX], db[PATH_MAX];
  return folder_of(a, da, sizeof da) && folder_of(b, db, sizeof db) && same_inode(da, db);
}

int wb_cli_parse_run(int argc, char **argv, wb_config *cfg) {
  wb_config user;
  memset(&user, 0, sizeof user);
  uint64_t given = 0;

  for (int i = 0; i < argc; i++) {
    const char *arg = argv[i];
    char q[WB_QUOTE_MAX];
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      /* Options before it are left unchecked, as with most tools; anything
       * after it is a mistake the help would hide. */
      if (i + 1 < argc)
        return usage_error("%s takes no arguments (got '%s')", arg,
                           wb_quote(q, sizeof q, argv[i + 1]));
      return -1;
    }
    if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
      if (arg[0] == '-') return usage_error("unknown option '%s'", wb_quote(q, sizeof q, arg));
      return usage_error("unexpected argument '%s'", wb_quote(q, sizeof q, arg));
    }
    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const wb_option *o = NULL;
    size_t idx = 0;
    for (; idx < NOPTIONS; idx++) {
      if (strlen(options[idx].name) == len && !strncmp(options[idx].name, name, len)) {
        o = &options[idx];
        break;
      }
    }
    if (!o) {
      char opt[WB_QUOTE_MAX];
      snprintf(opt, sizeof opt, "%.*s", (int)(len + 2), arg);
      return usage_error("unknown option '%s'", wb_quote(q, sizeof q, opt));
    }
    const char *value = NULL;
    if (o->type == OPT_FLAG) {
      if (eq) return usage_error("--%s takes no value", o->name);
    } else if (eq) {
      value = eq + 1;
    } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
      value = argv[++i];
    } else {
      return usage_error("--%s needs a value (%s)", o->name, o->metavar);
    }
    int rc = parse_value(o, value, &user);
    if (rc) return rc;
    given |= UINT64_C(1) << idx;
  }

  if (!(given & bit_of("scenario")))
    return usage_error("run needs --scenario NAME; '%s list' shows them", WB_PROG);

  /* Pass two: the scenario's defaults, then the given fields over them. */
  *cfg = user.scenario->defaults;
  cfg->scenario = user.scenario;
  for (size_t i = 0; i < NOPTIONS; i++) {
    if (given & (UINT64_C(1) << i))
      memcpy((char *)cfg + options[i].offset, (const char *)&user + options[i].offset,
             size_of(options[i].type));
  }

  if (cfg->pool == WB_POOL_BASIC) {
    if ((given & bit_of("max-elastic")) && cfg->max_elastic > 0)
      return usage_error("--max-elastic needs --pool elastic (this pool is basic)");
    if (given & bit_of("idle-ms"))
      return usage_error("--idle-ms needs --pool elastic (this pool is basic)");
    cfg->max_elastic = 0;
  }
  if (!(given & bit_of("workers")) && cfg->workers == 0) cfg->workers = wb_cpu_count();
  if (cfg->pool == WB_POOL_BASIC && cfg->workers == 0)
    return usage_error("a basic pool needs at least one worker (got --workers 0)");
  if (cfg->pool == WB_POOL_ELASTIC && cfg->workers == 0 && cfg->max_elastic == 0)
    return usage_error("the pool would have no workers at all: raise --workers or --max-elastic");
  if (cfg->bursts > cfg->tasks)
    return usage_error("--bursts %u is more than --tasks %" PRIu64, cfg->bursts, cfg->tasks);
  /* Pool features: the ways to submit exclude each other. */
  if ((cfg->groups > 0) + (cfg->handles > 0) + (cfg->batch > 0) + (cfg->delay_ms > 0) > 1)
    return usage_error(
        "--groups, --handles, --batch and --delay-ms are different ways to submit: pick one");
  if (cfg->cancel_pct > 0 && !cfg->handles)
    return usage_error("--cancel-pct needs --handles (a task is cancelled through its handle)");
  if (cfg->handles && cfg->async)
    return usage_error("--handles and --async cannot be combined: a handle's task is a plain task");
  if ((given & bit_of("full")) && !cfg->capacity)
    return usage_error("--full needs --capacity (the queue is unbounded)");
  if (cfg->batch && cfg->capacity && cfg->batch > cfg->capacity)
    return usage_error("--batch %u is more than --capacity %" PRIu64
                       ": a batch must fit in the queue",
                       cfg->batch, cfg->capacity);
  if (cfg->delay_ms && cfg->capacity && cfg->full == TKO_FULL_REJECT)
    return usage_error("--delay-ms with --full reject would drop the firings a full queue "
                       "refuses: use block or caller");
  if (cfg->delay_ms && cfg->async)
    return usage_error("--delay-ms and --async cannot be combined: timers submit plain tasks");
  if (cfg->max_async && !cfg->async)
    return usage_error("--max-async needs --async");
  if (cfg->resize.on && cfg->resize.max_elastic && cfg->pool == WB_POOL_BASIC)
    return usage_error("--resize with elastic workers needs --pool elastic (this pool is basic)");
  if (cfg->resize.on && cfg->resize.basic == 0 && cfg->pool == WB_POOL_BASIC)
    return usage_error("--resize: a basic pool needs at least one worker (got 0)");
  /* Two outputs into one file would overwrite each other. */
  const char *paths[] = {cfg->json_path, cfg->timeline_path, cfg->plot_path};
  static const char *const path_opts[] = {"--json", "--timeline", "--plot"};
  for (size_t i = 0; i < 3; i++) {
    for (size_t j = i + 1; j < 3; j++) {
      if (!paths[i] || !paths[j] || !same_file(paths[i], paths[j])) continue;
      char q[WB_QUOTE_MAX];
      if (!strcmp(paths[i], "-"))
        return usage_error("%s and %s both write to standard output ('-'): pick one",
                           path_opts[i], path_opts[j]);
      return usage_error("%s and %s name the same file '%s'", path_opts[i], path_opts[j],
                         wb_quote(q, sizeof q, paths[j]));
    }
  }
  if (cfg->tail_ms < 0) {
    bool retire_visible = cfg->pool == WB_POOL_ELASTIC &&
                          (cfg->max_elastic > 0 || cfg->resize.max_elastic > 0) &&
                          cfg->idle_ms <= 2000;
    cfg->tail_ms = retire_visible ? (long)cfg->idle_ms + 150 : 0;
  }
  return 0;
}
