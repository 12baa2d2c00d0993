#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds everything (library, workbench, benchmarks) and runs the workbench
# demo scenario. Installs its own packages first (scripts/deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
exec build/workbench/taskorch-workbench run --scenario demo --plot demo.svg "$@"
