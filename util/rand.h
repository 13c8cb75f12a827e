/* rand.h -- a small seedable pseudo-random generator, for what needs spread
 * rather than secrecy: retry jitter, and the ids an engine makes when it was
 * given no source of random ids (tests). Never for secrets. */
#ifndef CR_RAND_H
#define CR_RAND_H

#include <stdint.h>

/* The next value of xorshift64 (Marsaglia 2003) from *state, which it
 * advances. A zero state would stay zero, so it is replaced first. */
static inline uint64_t cr_xorshift64(uint64_t *state)
{
    uint64_t x = *state;
    if (x == 0)
        x = 0x9E3779B97F4A7C15u;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

#endif
