#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what taskorch's build, tests and benchmarks need on Debian 12.
# Runs apt as root (or through sudo); with TKO_SKIP_DEPS=1 it does nothing.
set -euo pipefail
[ "${TKO_SKIP_DEPS:-0}" = 1 ] && exit 0
packages=(build-essential cmake pkg-config clang libclang-rt-14-dev
          libcriterion-dev libjemalloc-dev libxml2-utils
          libglib2.0-dev libuv1-dev cthreadpool-dev
          abigail-tools doxygen groff-base python3 gcovr)
if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${packages[@]}" >/dev/null
