/* SPDX-License-Identifier: MIT */
/* bench_io: blocking I/O tasks of three real kinds on a basic pool sized to
 * the CPUs, a basic pool as wide as the elastic one, and an elastic pool
 * (with and without the tasks' blocking hint):
 *   sleep  a 1-10 ms sleep, standing in for a remote call;
 *   tcp    a request/response over loopback TCP to a server thread started
 *          here, which answers each request after a fixed delay;
 *   fsync  a small append plus fdatasync to a temporary file.
 * Reports wall time end to end (first submit to tko_pool_wait_idle) against
 * the ideal for the pool's thread count, and the elastic peak. Each kind's
 * latency is first measured inline, so the ideal uses the real cost of one
 * operation on this machine (sleep overshoot, loopback round trip, disk). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "bench_common.h"
#include "taskorch.h"

#define MSG_BYTES 64

/* ---- the loopback server ---------------------------------------------------- */

/* Reads a request per connection, answers it delay_ns later, then closes.
 * One thread with epoll and a timerfd, so it delays many requests at once
 * and never limits the pool's parallelism. Answers go out in arrival order,
 * which is also due order since the delay is constant. */
typedef struct conn {
  int fd;
  size_t got;
  uint64_t due;
  struct conn *next;
} conn;

typedef struct server {
  int listen_fd, epfd, timer_fd, stop_fd;
  struct sockaddr_in addr;
  uint64_t delay_ns;
  conn *head, *tail; /* answered in this order; touched by the server thread only */
  pthread_t thread;
} server;

static void arm_timer(server *s) {
  struct itimerspec its = {0};
  if (s->head) {
    its.it_value.tv_sec = (time_t)(s->head->due / 1000000000u);
    its.it_value.tv_nsec = (long)(s->head->due % 1000000000u);
    if (!its.it_value.tv_sec && !its.it_value.tv_nsec) its.it_value.tv_nsec = 1;
  }
  timerfd_settime(s->timer_fd, TFD_TIMER_ABSTIME, &its, NULL);
}

static void *server_main(void *arg) {
  server *s = arg;
  struct epoll_event ev[64];
  static const char reply[MSG_BYTES] = "pong";
  for (;;) {
    int n = epoll_wait(s->epfd, ev, 64, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) bench_die("epoll_wait: %s", strerror(errno));
    for (int i = 0; i < n; i++) {
      void *tag = ev[i].data.ptr;
      if (tag == &s->stop_fd) goto out;
      if (tag == &s->listen_fd) {
        int fd;
        while ((fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
          conn *c = calloc(1, sizeof *c);
          if (!c) bench_die("out of memory");
          c->fd = fd;
          struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
          epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &e);
        }
        continue;
      }
      if (tag == &s->timer_fd) {
        uint64_t expirations;
        if (read(s->timer_fd, &expirations, sizeof expirations) < 0) { /* spurious: fine */
        }
        uint64_t now = bench_now_ns();
        while (s->head && s->head->due <= now) {
          conn *c = s->head;
          s->head = c->next;
          if (!s->head) s->tail = NULL;
          /* 64 bytes into an empty socket buffer: never blocks. */
          if (write(c->fd, reply, sizeof reply) < 0) { /* the client gave up */
          }
          close(c->fd);
          free(c);
        }
        arm_timer(s);
        continue;
      }
      conn *c = tag;
      char buf[MSG_BYTES];
      ssize_t r = read(c->fd, buf, sizeof buf - c->got);
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (r <= 0) {
        close(c->fd);
        free(c);
        continue;
      }
      c->got += (size_t)r;
      if (c->got < MSG_BYTES) continue;
      epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
      c->due = bench_now_ns() + s->delay_ns;
      if (s->tail)
        s->tail->next = c;
      else
        s->head = c;
      s->tail = c;
      if (s->head == c) arm_timer(s);
    }
  }
out:
  while (s->head) {
    conn *c = s->head;
    s->head = c->next;
    close(c->fd);
    free(c);
  }
  return NULL;
}

static void server_start(server *s, uint64_t delay_ns) {
  memset(s, 0, sizeof *s);
  s->delay_ns = delay_ns;
  s->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s->listen_fd < 0) bench_die("socket: %s", strerror(errno));
  int one = 1;
  setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  s->addr.sin_family = AF_INET;
  s->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  s->addr.sin_port = 0; /* any free port */
  socklen_t len = sizeof s->addr;
  if (bind(s->listen_fd, (struct sockaddr *)&s->addr, sizeof s->addr) != 0 ||
      listen(s->listen_fd, 4096) != 0 ||
      getsockname(s->listen_fd, (struct sockaddr *)&s->addr, &len) != 0)
    bench_die("loopback server: %s", strerror(errno));
  s->epfd = epoll_create1(EPOLL_CLOEXEC);
  s->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  s->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->epfd < 0 || s->timer_fd < 0 || s->stop_fd < 0) bench_die("epoll/timerfd/eventfd failed");
  struct epoll_event e = {.events = EPOLLIN};
  e.data.ptr = &s->listen_fd;
  epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->listen_fd, &e);
  e.data.ptr = &s->timer_fd;
  epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->timer_fd, &e);
  e.data.ptr = &s->stop_fd;
  epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->stop_fd, &e);
  if (pthread_create(&s->thread, NULL, server_main, s)) bench_die("pthread_create failed");
}

static void server_stop(server *s) {
  uint64_t one = 1;
  if (write(s->stop_fd, &one, sizeof one) < 0) bench_die("eventfd write failed");
  pthread_join(s->thread, NULL);
  close(s->listen_fd);
  close(s->epfd);
  close(s->timer_fd);
  close(s->stop_fd);
}

/* ---- the tasks ------------------------------------------------------------------ */

enum { K_SLEEP, K_TCP, K_FSYNC, K_COUNT };
static const char *kind_name[K_COUNT] = {"sleep", "tcp", "fsync"};

static server srv;
static int fsync_fd = -1;
static long fsync_bytes;
static long sleep_min_ms, sleep_max_ms;

/* The sleep of task i, in a fixed pattern over [min, max] ms. */
static uint64_t sleep_ns_of(long i) {
  long span = sleep_max_ms - sleep_min_ms + 1;
  return (uint64_t)(sleep_min_ms + (i * 7) % span) * 1000000u;
}

static int sleep_task(void *arg) {
  bench_sleep_ns(sleep_ns_of((long)(intptr_t)arg));
  return 0;
}

static int tcp_task(void *arg) {
  (void)arg;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 1;
  int one = 1, rc = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char buf[MSG_BYTES] = "ping";
  if (connect(fd, (struct sockaddr *)&srv.addr, sizeof srv.addr) == 0 &&
      write(fd, buf, sizeof buf) == (ssize_t)sizeof buf) {
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf && (r = read(fd, buf + got, sizeof buf - got)) > 0)
      got += (size_t)r;
    rc = got == sizeof buf ? 0 : 1;
  }
  close(fd);
  return rc;
}

static int fsync_task(void *arg) {
  (void)arg;
  char buf[4096];
  memset(buf, 'x', sizeof buf);
  size_t n = (size_t)fsync_bytes < sizeof buf ? (size_t)fsync_bytes : sizeof buf;
  if (write(fsync_fd, buf, n) != (ssize_t)n) return 1;
  return fdatasync(fsync_fd) == 0 ? 0 : 1;
}

static tko_task_fn kind_fn[K_COUNT] = {sleep_task, tcp_task, fsync_task};

/* The same tasks announcing their blocking to the pool (tko_blocking_begin),
 * which lets an elastic pool add a worker at once instead of waiting for a
 * backlog. */
#define HINTED(fn)                                                                                 \
  static int fn##_hinted(void *arg) {                                                              \
    tko_blocking_begin();                                                                          \
    int rc = fn(arg);                                                                              \
    tko_blocking_end();                                                                            \
    return rc;                                                                                     \
  }
HINTED(sleep_task)
HINTED(tcp_task)
HINTED(fsync_task)
static tko_task_fn kind_fn_hinted[K_COUNT] = {sleep_task_hinted, tcp_task_hinted,
                                              fsync_task_hinted};

static void fsync_open(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/taskorch-bench-io-XXXXXX", dir);
  int fd = mkstemp(path);
  if (fd < 0) bench_die("cannot create a file in %s: %s (use --dir)", dir, strerror(errno));
  close(fd);
  fsync_fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
  unlink(path); /* the open descriptor keeps it until closed */
  if (fsync_fd < 0) bench_die("open %s: %s", path, strerror(errno));
}

static void fsync_close(void) {
  close(fsync_fd);
  fsync_fd = -1;
}

static const char *fs_name(const char *dir) {
  static char buf[32];
  struct statfs sf;
  if (statfs(dir, &sf) != 0) return "unknown";
  switch ((unsigned long)sf.f_type) {
  case 0xEF53: return "ext2/3/4";
  case 0x01021994: return "tmpfs (fdatasync does no disk I/O)";
  case 0x58465342: return "xfs";
  case 0x9123683E: return "btrfs";
  case 0x794C7630: return "overlayfs";
  default: snprintf(buf, sizeof buf, "type 0x%lx", (unsigned long)sf.f_type); return buf;
  }
}

/* ---- measurement ------------------------------------------------------------------ */

/* Mean latency of one operation of kind k run inline (for sleep: the mean
 * overshoot beyond the requested time, added to each task's sleep later). */
static double inline_latency_ns(int k, long samples) {
  double total = 0;
  for (long i = 0; i < samples; i++) {
    uint64_t t0 = bench_now_ns();
    if (kind_fn[k]((void *)(intptr_t)i) != 0)
      bench_die("%s: inline operation failed", kind_name[k]);
    double ns = (double)(bench_now_ns() - t0);
    total += k == K_SLEEP ? ns - (double)sleep_ns_of(i) : ns;
  }
  return total / (double)samples;
}

/* Lower bound on wall time for n tasks of kind k on `threads` threads. */
static double ideal_ns(int k, long n, unsigned threads, double lat) {
  double sum = 0, longest = 0;
  for (long i = 0; i < n; i++) {
    double l = k == K_SLEEP ? (double)sleep_ns_of(i) + lat : lat;
    sum += l;
    if (l > longest) longest = l;
  }
  unsigned t = (long)threads < n ? threads : (unsigned)n;
  double spread = sum / (double)t;
  return spread > longest ? spread : longest;
}

typedef struct pool_cfg {
  char label[64];
  tko_options opts;
  unsigned threads; /* most threads the pool may run */
  bool hinted;      /* tasks call tko_blocking_begin/end around their I/O */
} pool_cfg;

static double run_once(const pool_cfg *pc, int k, long n, unsigned *peak, uint64_t *failed) {
  tko_pool *pool;
  int rc = tko_pool_create(&pool, &pc->opts);
  if (rc) bench_die("tko_pool_create: %s", tko_strerror(rc));
  bench_wait_others_asleep(500);
  uint64_t t0 = bench_now_ns();
  for (long i = 0; i < n; i++)
    if ((rc = tko_submit(pool, pc->hinted ? kind_fn_hinted[k] : kind_fn[k], (void *)(intptr_t)i,
                         0)) != 0)
      bench_die("tko_submit: %s", tko_strerror(rc));
  tko_pool_wait_idle(pool, -1);
  double ns = (double)(bench_now_ns() - t0);
  tko_stats st;
  tko_pool_stats(pool, &st);
  *peak = st.elastic_peak;
  *failed = st.failed + ((long)st.completed == n ? 0 : 1);
  tko_pool_destroy(pool);
  return ns;
}

int main(int argc, char **argv) {
  bench_list sizes;
  long workers, wide, ebasic, emax, eidle, delay_us;
  const char *kinds_opt, *dir;
  unsigned cpus = bench_cpus();
  char def_workers[16];
  snprintf(def_workers, sizeof def_workers, "%u", cpus);
  const char *tmp = getenv("TMPDIR");
  bench_opt opts[] = {
      {"tasks", BENCH_OPT_LIST, &sizes, "100,1000", "8", 1, 1e6, "task counts to run"},
      {"kinds", BENCH_OPT_STRING, &kinds_opt, "sleep,tcp,fsync", NULL, 0, 0,
       "I/O kinds to run, of sleep, tcp, fsync"},
      {"sleep-min-ms", BENCH_OPT_LONG, &sleep_min_ms, "1", NULL, 0, 10000, "shortest sleep"},
      {"sleep-max-ms", BENCH_OPT_LONG, &sleep_max_ms, "10", "2", 0, 10000, "longest sleep"},
      {"tcp-delay-us", BENCH_OPT_LONG, &delay_us, "1000", "200", 0, 10000000,
       "the loopback server's delay before each answer"},
      {"fsync-bytes", BENCH_OPT_LONG, &fsync_bytes, "512", NULL, 1, 4096,
       "bytes appended before each fdatasync"},
      {"dir", BENCH_OPT_STRING, &dir, tmp && *tmp ? tmp : "/var/tmp", "/tmp", 0, 0,
       "directory for the fsync file ($TMPDIR, else /var/tmp)"},
      {"workers", BENCH_OPT_LONG, &workers, def_workers, NULL, 1, 1024,
       "narrow basic pool's workers (the CPU count)"},
      {"wide-workers", BENCH_OPT_LONG, &wide, "16", "4", 1, 1024,
       "wide basic pool's workers (as many as the elastic pool can reach)"},
      {"elastic-basic", BENCH_OPT_LONG, &ebasic, "2", NULL, 0, 1024,
       "elastic pool's basic workers"},
      {"elastic-max", BENCH_OPT_LONG, &emax, "14", "2", 1, 1024, "elastic pool's extra workers"},
      {"elastic-idle-ms", BENCH_OPT_LONG, &eidle, "1000", NULL, 1, 3600000, "elastic idle timeout"},
  };
  bench *b = bench_init(argc, argv, "bench_io",
                        "Blocking I/O tasks (sleep, loopback TCP request/response, append + "
                        "fdatasync) on narrow basic, wide basic and elastic pools: wall time end "
                        "to end against the ideal for the thread count, and the elastic peak.",
                        opts, sizeof opts / sizeof opts[0]);
  if (sleep_min_ms > sleep_max_ms) {
    fprintf(stderr, "bench_io: --sleep-min-ms is above --sleep-max-ms\n");
    return 2;
  }
  bool kind_on[K_COUNT] = {false};
  for (const char *p = kinds_opt; *p;) {
    size_t len = strcspn(p, ",");
    int k = 0;
    while (k < K_COUNT && !(strlen(kind_name[k]) == len && !strncmp(kind_name[k], p, len)))
      k++;
    if (k == K_COUNT) {
      fprintf(stderr, "bench_io: --kinds: unknown '%.*s' (known: sleep, tcp, fsync)\n", (int)len,
              p);
      return 2;
    }
    kind_on[k] = true;
    p += len + (p[len] == ',');
  }

  server_start(&srv, (uint64_t)delay_us * 1000u);
  fsync_open(dir);
  bench_config(b, "tcp server", "127.0.0.1:%u, one epoll thread, answers %ld us after each request",
               ntohs(srv.addr.sin_port), delay_us);
  bench_config(b, "fsync file system", "%s", fs_name(dir));

  long max_n = 0;
  for (size_t s = 0; s < sizes.n; s++)
    if (sizes.v[s] > max_n) max_n = sizes.v[s];
  long samples = max_n < 20 ? max_n : 20;
  double lat[K_COUNT] = {0};
  for (int k = 0; k < K_COUNT; k++) {
    if (!kind_on[k]) continue;
    lat[k] = inline_latency_ns(k, samples);
    bench_config(b,
                 k == K_SLEEP ? "inline sleep overshoot"
                 : k == K_TCP ? "inline tcp round trip"
                              : "inline append+fdatasync",
                 "%.1f us (mean of %ld)", lat[k] / 1e3, samples);
  }

  pool_cfg pools[4] = {0};
  snprintf(pools[0].label, sizeof pools[0].label, "basic %ld", workers);
  pools[0].opts = tko_basic_options((unsigned)workers);
  pools[0].threads = (unsigned)workers;
  snprintf(pools[1].label, sizeof pools[1].label, "basic %ld", wide);
  pools[1].opts = tko_basic_options((unsigned)wide);
  pools[1].threads = (unsigned)wide;
  snprintf(pools[2].label, sizeof pools[2].label, "elastic %ld+%ld", ebasic, emax);
  pools[2].opts = tko_elastic_options((unsigned)ebasic, (unsigned)emax, (unsigned)eidle);
  pools[2].threads = (unsigned)(ebasic + emax);
  pools[3] = pools[2];
  snprintf(pools[3].label, sizeof pools[3].label, "elastic %ld+%ld, blocking hint", ebasic, emax);
  pools[3].hinted = true;

  size_t runs = (size_t)b->runs, np = 4;
  double *res = calloc(K_COUNT * sizes.n * np * runs, sizeof *res);
  unsigned *peak = calloc(K_COUNT * sizes.n * np, sizeof *peak);
  if (!res || !peak) bench_die("out of memory");
#define IDX(k, s, p) (((size_t)(k)*sizes.n + (s)) * np + (p))
  uint64_t failures = 0;
  for (size_t r = 0; r < runs; r++)
    for (int k = 0; k < K_COUNT; k++) {
      if (!kind_on[k]) continue;
      for (size_t s = 0; s < sizes.n; s++)
        for (size_t p = 0; p < np; p++) {
          unsigned pk;
          uint64_t failed;
          res[IDX(k, s, p) * runs + r] = run_once(&pools[p], k, sizes.v[s], &pk, &failed);
          if (pk > peak[IDX(k, s, p)]) peak[IDX(k, s, p)] = pk;
          failures += failed;
        }
    }
  server_stop(&srv);
  fsync_close();
  bench_check(b, failures == 0, "%llu I/O tasks failed or went missing",
              (unsigned long long)failures);

  bench_table *t = bench_table_new(b, "io", "blocking I/O tasks, end to end");
  for (int k = 0; k < K_COUNT; k++) {
    if (!kind_on[k]) continue;
    for (size_t s = 0; s < sizes.n; s++)
      for (size_t p = 0; p < np; p++) {
        double *v = &res[IDX(k, s, p) * runs];
        double med = bench_median(v, runs);
        double ideal = ideal_ns(k, sizes.v[s], pools[p].threads, lat[k]);
        bench_row(t);
        bench_cell_str(t, "kind", "%s", kind_name[k]);
        bench_cell_int(t, "tasks", sizes.v[s]);
        bench_cell_str(t, "pool", "%s", pools[p].label);
        bench_cell_num(t, "wall ms", "%.2f", med / 1e6);
        bench_cell_num(t, "min ms", "%.2f", bench_min(v, runs) / 1e6);
        bench_cell_num(t, "max ms", "%.2f", bench_max(v, runs) / 1e6);
        bench_cell_num(t, "ideal ms", "%.2f", ideal / 1e6);
        bench_cell_num(t, "wall/ideal", "%.3f", med / ideal);
        if (p >= 2)
          bench_cell_int(t, "elastic peak", peak[IDX(k, s, p)]);
        else
          bench_cell_str(t, "elastic peak", "-");
      }
  }
  bench_table_print(t);
  bench_note(b, "ideal = max(sum of task latencies / threads, longest task), with each latency "
                "measured inline above; fdatasync calls on one file may serialize in the file "
                "system, so its ideal is optimistic.");
  free(res);
  free(peak);
  return bench_finish(b);
}
