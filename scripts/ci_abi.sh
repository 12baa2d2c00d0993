#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI step (run by scripts/test.sh): the ABI policy, checked with libabigail
# (Debian: abigail-tools). The policy (README, "Versioning and ABI"): before
# 1.0 every minor release may change the ABI and then has a soname of its
# own (libtaskorch.so.0.<minor>); within one soname the ABI only grows.
#
#   scripts/ci_abi.sh                 compare this tree's libraries with the
#                                     last release's (tests/abi/*-<version>.abi)
#   scripts/ci_abi.sh baseline REV VERSION
#                                     write tests/abi/*-VERSION.abi from the
#                                     libraries of commit REV (at a release)
#
# The comparison passes when the public ABI is unchanged or only grew
# (functions added); a changed or removed function or variable, a public
# type whose layout changed included, passes only under a new soname.
# Changes to private types (src/) are not reported: only types defined in
# include/ and compat/ count.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
libs=(taskorch taskorch-thpool)

# build_libs SRC_DIR BUILD_DIR: the two shared libraries, with debug info.
build_libs() {
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTKO_BUILD_TESTS=OFF \
    -DTKO_BUILD_BENCHMARKS=OFF -DTKO_BUILD_WORKBENCH=OFF >/dev/null
  cmake --build "$2" -j "$(nproc)" --target "${libs[@]}" >/dev/null
}
# lib_file BUILD_DIR NAME: the real file of lib<NAME>.so.
lib_file() { readlink -f "$(find "$1" -name "lib$2.so" | head -n 1)"; }

if [ "${1:-}" = baseline ]; then
  rev=${2:?usage: scripts/ci_abi.sh baseline REV VERSION}
  version=${3:?usage: scripts/ci_abi.sh baseline REV VERSION}
  mkdir "$tmp/src"
  git archive "$rev" | tar -x -C "$tmp/src"
  build_libs "$tmp/src" "$tmp/build"
  for lib in "${libs[@]}"; do
    # Paths in the dump are made relative to the source tree.
    abidw --no-comp-dir-path --no-corpus-path --out-file "$tmp/$lib.abi" \
      "$(lib_file "$tmp/build" "$lib")"
    sed "s|$tmp/src/||g" "$tmp/$lib.abi" >"tests/abi/lib$lib-$version.abi"
    echo "ci_abi: wrote tests/abi/lib$lib-$version.abi"
  done
  exit 0
fi

command -v abidiff >/dev/null || { echo "ci_abi: abidiff not found (Debian: abigail-tools)" >&2; exit 1; }
last=$(find tests/abi -name 'libtaskorch-[0-9]*.abi' | sed 's|.*libtaskorch-||; s|\.abi$||' |
       sort -V | tail -n 1)
echo "== ci_abi: this tree's libraries against release $last (tests/abi/)"
build_libs . "$tmp/build"
status=0
for lib in "${libs[@]}"; do
  base=tests/abi/lib$lib-$last.abi
  new=$(lib_file "$tmp/build" "$lib")
  old_soname=$(sed -n "1s/.*soname='\([^']*\)'.*/\1/p" "$base")
  new_soname=$(readelf -d "$new" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
  rc=0
  abidiff --headers-dir2 include --header-file2 compat/thpool.h "$base" "$new" >"$tmp/$lib.diff" || rc=$?
  if [ $((rc & 3)) -ne 0 ]; then
    cat "$tmp/$lib.diff" >&2
    echo "ci_abi: abidiff failed on lib$lib (exit $rc)" >&2
    exit 1
  fi
  # "Functions changes summary: R Removed, C Changed (...), A Added functions"
  # (abidiff prints nothing at all when nothing changed.)
  broken=$({ grep -E '^(Functions|Variables) changes summary' "$tmp/$lib.diff" || true; } |
           sed -E 's/.*: ([0-9]+) Removed, ([0-9]+) Changed.*/\1 \2/' |
           awk '{n += $1 + $2} END {print n + 0}')
  summary=$(grep -E '^Functions changes summary' "$tmp/$lib.diff" | sed 's/^Functions changes summary: //' || true)
  if [ "$broken" -eq 0 ]; then
    echo "   lib$lib: compatible with $last (functions: ${summary:-no change})"
  elif [ "$old_soname" != "$new_soname" ]; then
    echo "   lib$lib: ABI changed, under a new soname ($old_soname -> $new_soname), as the policy asks"
  else
    cat "$tmp/$lib.diff" >&2
    echo "ci_abi: lib$lib's ABI changed since $last but its soname is still $new_soname;" \
         "the policy (README, Versioning and ABI) asks for a new soname" >&2
    status=1
  fi
done
exit $status
