# SPDX-License-Identifier: MIT
# tko_add_executable(<name> <sources>...): an executable of taskorch's own
# (a test, a benchmark, an example) as target tko_<name>, so its name cannot
# clash with a host's targets when taskorch is embedded, while the file
# keeps its short name (build/tests/test_pool, build/benchmarks/bench_cpu).
# It gets taskorch's warnings (TKO_WARNINGS).
function(tko_add_executable name)
  add_executable(tko_${name} ${ARGN})
  set_target_properties(tko_${name} PROPERTIES OUTPUT_NAME ${name})
  target_compile_options(tko_${name} PRIVATE ${TKO_WARNINGS})
endfunction()
