#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI step (run by scripts/test.sh): install taskorch to a temporary prefix,
# move that prefix elsewhere (the pkg-config and CMake files must follow),
# then build and run what a user would against it:
#   - examples/hello.c through pkg-config, shared and fully static (--static);
#   - examples/thpool_example.c through pkg-config (taskorch-thpool);
#   - both through find_package(taskorch) (the host project tests/host/),
#     run with no LD_LIBRARY_PATH;
#   - every installed header from C++ (g++ and clang++, -std=c++11/17/20,
#     -Wall -Wextra -pedantic -Werror), with tests/cxx/headers.cpp's checks,
#     linked and run once.
# And the .pc files' two forms (cmake/TkoPkgConfig.cmake): a packager's
# install to DESTDIR with prefix /usr writes absolute paths, which pkgconf
# drops as system directories; TKO_PKGCONFIG_RELOCATABLE=ON/OFF overrides.
# Usage: scripts/ci_install.sh [build dir, default build-ci-install]
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
build=${1:-build-ci-install}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc=${CC:-cc}

step() { echo "== ci_install: $*"; }
# Runs a program and checks its last line of output for a pattern.
run_expect() {
  local pattern=$1
  shift
  local out
  out=$("$@")
  grep -q -- "$pattern" <<<"$out" || { echo "$*: expected '$pattern', got:" >&2; echo "$out" >&2; exit 1; }
}

step "build the libraries ($build) and install to a temporary prefix"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTKO_WERROR=ON -DTKO_BUILD_TESTS=OFF \
  -DTKO_BUILD_BENCHMARKS=OFF -DTKO_BUILD_WORKBENCH=OFF -DTKO_PKGCONFIG_RELOCATABLE=AUTO >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
cmake --install "$build" --prefix "$tmp/stage" >/dev/null
mv "$tmp/stage" "$tmp/prefix"
prefix=$tmp/prefix
libdir=$(dirname "$(find "$prefix" -name taskorch.pc)")/..
libdir=$(cd "$libdir" && pwd)

# Only the installed .pc files: nothing from the system may stand in.
export PKG_CONFIG_LIBDIR=$libdir/pkgconfig
unset PKG_CONFIG_PATH
[ "$(pkg-config --variable=includedir taskorch)" -ef "$prefix/include" ] ||
  { echo "taskorch.pc: includedir does not follow the moved prefix" >&2; exit 1; }

step "hello.c through pkg-config (shared)"
# shellcheck disable=SC2046
"$cc" -o "$tmp/hello" examples/hello.c $(pkg-config --cflags --libs taskorch)
readelf -d "$tmp/hello" | grep -q 'NEEDED.*libtaskorch\.so' ||
  { echo "hello is not linked to libtaskorch.so" >&2; exit 1; }
run_expect "completed 3 of 3" env LD_LIBRARY_PATH="$libdir" "$tmp/hello"

step "hello.c through pkg-config --static (a fully static program)"
# shellcheck disable=SC2046
"$cc" -static -o "$tmp/hello_static" examples/hello.c $(pkg-config --static --cflags --libs taskorch)
if readelf -d "$tmp/hello_static" 2>/dev/null | grep -q NEEDED; then
  echo "hello_static has dynamic dependencies" >&2
  exit 1
fi
run_expect "completed 3 of 3" "$tmp/hello_static"

step "thpool_example.c through pkg-config (taskorch-thpool; runpath, no LD_LIBRARY_PATH)"
readelf -d "$libdir/libtaskorch-thpool.so" | grep -q 'R.*PATH.*\$ORIGIN' ||
  { echo "libtaskorch-thpool.so has no \$ORIGIN runpath" >&2; exit 1; }
# shellcheck disable=SC2046
"$cc" -o "$tmp/thpool_example" examples/thpool_example.c \
  $(pkg-config --cflags --libs taskorch-thpool) -Wl,-rpath,"$libdir"
run_expect "Sum of squares 0..39: 20540 (expected 20540)" env -u LD_LIBRARY_PATH "$tmp/thpool_example"

step "hello.c and thpool_example.c through find_package(taskorch)"
cmake -S tests/host -B "$tmp/host" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/host" -j "$(nproc)" >/dev/null
run_expect "completed 3 of 3" env -u LD_LIBRARY_PATH "$tmp/host/host_hello"
run_expect "completed 3 of 3" env -u LD_LIBRARY_PATH "$tmp/host/host_hello_static"
run_expect "Sum of squares 0..39: 20540 (expected 20540)" env -u LD_LIBRARY_PATH "$tmp/host/host_thpool"

step "every installed header from C++ (g++, clang++; c++11, c++17, c++20)"
# The installed headers, each included, so a header added later is covered.
{
  (cd "$prefix/include" && find . -name '*.h' | sort | sed 's|^\./\(.*\)|#include <\1>|')
  echo "#include \"$src/tests/cxx/headers.cpp\""
} >"$tmp/all_headers.cpp"
cxx_flags=(-Wall -Wextra -pedantic -Werror -I"$prefix/include" -I"$prefix/include/taskorch/compat")
for cxx in g++ clang++; do
  for std in c++11 c++17 c++20; do
    "$cxx" -std="$std" "${cxx_flags[@]}" -c "$tmp/all_headers.cpp" -o "$tmp/all_headers.o"
  done
done
# shellcheck disable=SC2046
g++ -std=c++17 "${cxx_flags[@]}" -o "$tmp/cxx_hello" "$tmp/all_headers.cpp" \
  $(pkg-config --libs taskorch) -Wl,-rpath,"$libdir"
run_expect "C++: taskorch .*, 1 task ran" "$tmp/cxx_hello"

# pc_of DIR: the directory holding the taskorch.pc installed under DIR.
pc_of() { dirname "$(find "$1" -name taskorch.pc)"; }
# pc_flags ARGS: pkg-config's answer, one space between flags.
pc_flags() { local words; read -r -a words <<<"$(pkg-config "$@")"; echo "${words[*]}"; }

step "pkg-config files of a DESTDIR install with prefix /usr: absolute, system dirs dropped"
DESTDIR=$tmp/dest cmake --install "$build" --prefix /usr >/dev/null
export PKG_CONFIG_LIBDIR
PKG_CONFIG_LIBDIR=$(pc_of "$tmp/dest")
for m in taskorch taskorch-thpool; do
  grep -qx 'prefix=/usr' "$PKG_CONFIG_LIBDIR/$m.pc" || { cat "$PKG_CONFIG_LIBDIR/$m.pc" >&2; exit 1; }
done
flags=$(pc_flags --cflags --libs taskorch-thpool)
[ "$flags" = "-I/usr/include/taskorch/compat -ltaskorch-thpool -ltaskorch" ] ||
  { echo "taskorch-thpool for /usr: '$flags'" >&2; exit 1; }
flags=$(pc_flags --static --cflags --libs taskorch)
[ "$flags" = "-ltaskorch -pthread" ] || { echo "taskorch --static for /usr: '$flags'" >&2; exit 1; }

step "pkg-config files: /usr/local absolute too; TKO_PKGCONFIG_RELOCATABLE=ON and OFF"
DESTDIR=$tmp/dest-local cmake --install "$build" --prefix /usr/local >/dev/null
grep -qx 'prefix=/usr/local' "$(pc_of "$tmp/dest-local")/taskorch.pc" ||
  { echo "taskorch.pc for /usr/local is not absolute" >&2; exit 1; }
cmake "$build" -DTKO_PKGCONFIG_RELOCATABLE=ON >/dev/null
DESTDIR=$tmp/dest-on cmake --install "$build" --prefix /usr >/dev/null
# shellcheck disable=SC2016
grep -q '^prefix=${pcfiledir}/' "$(pc_of "$tmp/dest-on")/taskorch.pc" ||
  { echo "TKO_PKGCONFIG_RELOCATABLE=ON: taskorch.pc is not relocatable" >&2; exit 1; }
cmake "$build" -DTKO_PKGCONFIG_RELOCATABLE=OFF >/dev/null
cmake --install "$build" --prefix "$tmp/abs" >/dev/null
grep -qx "prefix=$tmp/abs" "$(pc_of "$tmp/abs")/taskorch.pc" ||
  { echo "TKO_PKGCONFIG_RELOCATABLE=OFF: taskorch.pc is not absolute" >&2; exit 1; }
PKG_CONFIG_LIBDIR=$(pc_of "$tmp/abs")
flags=$(pc_flags --cflags taskorch)
[ "$flags" = "-I$tmp/abs/include" ] || { echo "TKO_PKGCONFIG_RELOCATABLE=OFF: '$flags'" >&2; exit 1; }
cmake "$build" -DTKO_PKGCONFIG_RELOCATABLE=AUTO >/dev/null

step "passed (prefix $prefix, source $src)"
