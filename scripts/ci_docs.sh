#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI step (run by scripts/test.sh): the reference documentation builds
# (Doxygen over the public headers, the CMake target `docs`) with no
# warning, so an undocumented public symbol fails CI. The workbench's man
# page is checked by the CTest workbench_manpage.
# Usage: scripts/ci_docs.sh [build dir, default build-ci-docs]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-ci-docs}
command -v doxygen >/dev/null || { echo "ci_docs: doxygen not found (Debian: doxygen)" >&2; exit 1; }
cmake -S . -B "$build" -DTKO_BUILD_TESTS=OFF -DTKO_BUILD_BENCHMARKS=OFF \
  -DTKO_BUILD_WORKBENCH=OFF >/dev/null
if ! cmake --build "$build" --target docs >"$build/docs.log" 2>&1; then
  cat "$build/docs.log" "$build/docs/doxygen-warnings.log" >&2 || true
  echo "ci_docs: Doxygen found undocumented or badly documented public symbols (above)" >&2
  exit 1
fi
echo "== ci_docs: passed ($build/docs/html/index.html)"
