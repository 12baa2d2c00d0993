// SPDX-License-Identifier: MIT
// A task must not throw. A C++ exception that leaves a task finds no
// handler on the worker thread (below the task are only the library's C
// frames and the thread's start), so the C++ runtime calls std::terminate
// and the process aborts. This test pins that down: a child process
// submits a throwing task to a 1-worker pool and must die by SIGABRT.
// Built when CMake finds a C++ compiler (tests/CMakeLists.txt).
#include <taskorch.h>

#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static int throwing_task(void *) { throw std::runtime_error("a task threw"); }

// The child: returns only if the throw did not end the process.
static int child() {
  struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core); // the abort is expected: no core file
  tko_options opts = tko_basic_options(1);
  tko_pool *pool = nullptr;
  if (tko_pool_create(&pool, &opts) != 0) return 2;
  tko_group group;
  tko_group_init(&group);
  if (tko_group_submit(pool, &group, throwing_task, nullptr, 0) != 0) return 3;
  tko_group_wait(&group, -1);
  return 4;
}

int main() {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) _exit(child());
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) {
    std::perror("waitpid");
    return 1;
  }
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT) {
    std::printf("a throwing task aborted the process (SIGABRT), as documented\n");
    return 0;
  }
  if (WIFEXITED(status))
    std::fprintf(stderr, "the child exited with %d: a throwing task did not abort\n",
                 WEXITSTATUS(status));
  else
    std::fprintf(stderr, "the child died by signal %d, not SIGABRT\n",
                 WIFSIGNALED(status) ? WTERMSIG(status) : -1);
  return 1;
}
