/* core/rng.h: the counter-based generator random ops share (a module interface of core/ for
 *   the modules above it: not installed, not internal.h).
 * Owns: bits(seed, counter) = splitmix64(seed ^ splitmix64(counter)), the same function as
 *   core/init.c's initializers (which keep a private copy for now), and its mapping to
 *   [0, 1). A draw is a pure function of (seed, counter): no state, so values never depend
 *   on thread count, scheduling or the order elements are visited.
 * How dropout uses it (ops/dropout_cpu.c): key = bits(seed, step), then element i draws
 *   unit(bits(key, i)); so a session's run count changes the mask and a node with equal
 *   attributes in the same run draws the same one.
 * Not here: initializers (core/init.c), the ops that draw (ops/). */
#ifndef WF_CORE_RNG_H
#define WF_CORE_RNG_H

#include <stdint.h>

static inline uint64_t wf__rng_splitmix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* 64 random bits for 'counter' under 'seed'. */
static inline uint64_t wf__rng_bits(uint64_t seed, uint64_t counter)
{
    return wf__rng_splitmix64(seed ^ wf__rng_splitmix64(counter));
}

/* [0, 1) with 53 random bits of 'x'. */
static inline double wf__rng_unit(uint64_t x)
{
    return (double)(x >> 11) * 0x1.0p-53;
}

#endif /* WF_CORE_RNG_H */
