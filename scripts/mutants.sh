#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Mutation testing: applies each deliberate bug of scripts/mutants.list to a
# scratch copy of the tree, builds, runs the tests named for it with a time
# bound and prints a killed/survived table; exits non-zero on any survivor
# or stale mutant. Usage and environment: see scripts/mutants.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/mutants.py "$@"
