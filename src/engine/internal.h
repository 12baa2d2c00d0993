/* SPDX-License-Identifier: MIT */
/* Everything the engine shares, for a file that reaches into most of it
 * (white-box tests, benchmarks): the pool's layout (pool.h), task kinds
 * (kind.h), the engine's prototypes (engine.h) and the wake path (wake.h).
 * The library's own files include what they use. */
#ifndef TKO_INTERNAL_H
#define TKO_INTERNAL_H

#include "engine.h"
#include "kind.h"
#include "pool.h"
#include "wake.h"

#endif
