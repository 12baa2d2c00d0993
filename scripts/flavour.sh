# SPDX-License-Identifier: MIT
# Sourced by scripts/test.sh and scripts/ci.sh: how a test flavour is
# configured, built and run. A flavour is a build folder build-test-<name>.
#
#   plain     the default build
#   onequeue  plain, on pools of one queue: what tko_options.queues = 0
#             means (TKO_DEFAULT_QUEUES; the default, 0, is a queue per
#             basic worker; src/engine/shard.c)
#   release   a Release build with link-time optimisation of every target
#             but the installed static library, the test library included
#             (TKO_LTO builds the shared library and the benchmarks so;
#             here the suite checks the inlined code)
#   thread    ThreadSanitizer, with the lock-order checker (src/platform/witness.h)
#   address   AddressSanitizer+UBSan, with the lock-order checker

tko_jobs=${TKO_JOBS:-$(nproc)}

# tko_flavour_build NAME: configures and builds build-test-NAME; the
# compiler's output goes to build-test-NAME/build.log, shown on failure.
tko_flavour_build() {
  local flavour=$1 san= queues=0 witness=OFF dir=build-test-$1 gen=() type=RelWithDebInfo lto=()
  case $flavour in
    plain) ;;
    release) type=Release lto=(-DCMAKE_INTERPROCEDURAL_OPTIMIZATION=ON) ;;
    onequeue) queues=1 ;;
    thread | address) san=$flavour witness=ON ;;
    *) echo "flavour.sh: unknown flavour '$flavour'" >&2; return 2 ;;
  esac
  # Ninja for a new folder (it starts the next compile sooner than make's
  # recursion); a folder made before keeps its generator.
  if [ ! -f "$dir/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then gen=(-G Ninja); fi
  echo "== $flavour: configure and build ($dir; $queues queues by default)"
  mkdir -p "$dir"
  if ! { cmake -S . -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE="$type" "${lto[@]}" \
           -DTKO_SANITIZE="$san" -DTKO_BUILD_TESTS=ON -DTKO_WERROR=ON -DTKO_LOCK_ORDER_CHECK=$witness \
           -DTKO_DEFAULT_QUEUES="$queues" &&
         cmake --build "$dir" -j "$tko_jobs"; } >"$dir/build.log" 2>&1; then
    echo "== $flavour: build FAILED; the end of $dir/build.log:" >&2
    tail -n 60 "$dir/build.log" >&2
    return 1
  fi
  echo "== $flavour: built"
}

# tko_flavour_test NAME: runs the suite of build-test-NAME.
tko_flavour_test() {
  local dir=build-test-$1
  echo "== $1: tests"
  # halt_on_error: a sanitizer report fails the run instead of scrolling by.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  ASAN_OPTIONS="detect_leaks=1 halt_on_error=1" \
  UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1" \
    ctest --test-dir "$dir" --output-on-failure -j 1
}
