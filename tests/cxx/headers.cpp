// SPDX-License-Identifier: MIT
// Every public header, included from C++ (scripts/ci_cxx.sh builds this with
// g++ and clang++, -std=c++11/17/20, -Wall -Wextra -pedantic -Werror, and
// runs it once). It also checks that C++ sees the same layout as C.
#include <taskorch.h>
#include <taskorch/coalescer.h>
#include <taskorch/lanes.h>
#include <thpool.h>

#include <cstdio>
#include <cstring>

static_assert(alignof(tko_group) == 16, "tko_group keeps its alignment in C++");
static_assert(alignof(tko_timer) == 16, "tko_timer keeps its alignment in C++");
static_assert(sizeof(tko_group) == 160, "tko_group keeps its size in C++");
static_assert(sizeof(tko_timer) == 64, "tko_timer keeps its size in C++");

static int task(void *arg) {
  ++*static_cast<int *>(arg);
  return 0;
}

int main() {
  tko_options opts = tko_basic_options(2);
  tko_pool *pool = nullptr;
  if (tko_pool_create(&pool, &opts) != 0) return 1;
  int ran = 0;
  tko_group group;
  tko_group_init(&group);
  if (tko_group_submit(pool, &group, task, &ran, 0) != 0) return 1;
  tko_group_wait(&group, -1);
  tko_group_destroy(&group);
  if (tko_pool_destroy(pool) != 0 || ran != 1) return 1;
  std::printf("C++: taskorch %s, %d task ran\n", tko_version_string(), ran);
  return std::strcmp(tko_version_string(), TKO_VERSION_STRING) == 0 ? 0 : 1;
}
