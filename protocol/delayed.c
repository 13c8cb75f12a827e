/* delayed.c -- native delayed delivery names, keys and decision (no I/O). */
#include "delayed.h"

#include <stdio.h>
#include <string.h>

#include "util/err.h"

static int too_small(char *out, size_t size)
{
    if (size)
        out[0] = '\0';
    return CR_ERANGE;
}

int delayed_level_name(int level, char *out, size_t size)
{
    int n;
    if (level < 0 || level > DELAYED_MAX_LEVEL)
        return CR_EINVAL;
    n = snprintf(out, size, "celery_delayed_%d", level);
    return n < 0 || (size_t)n >= size ? too_small(out, size) : 0;
}

int delayed_routing_key(uint64_t delay_s, const char *rk, char *out, size_t size)
{
    size_t rklen = rk ? strlen(rk) : 0;
    size_t need = 2 * DELAYED_LEVELS + rklen + 1;
    char *p = out;

    if (delay_s < 1 || delay_s > DELAYED_MAX_S || rklen == 0)
        return CR_EINVAL;
    if (size < need || need > (size_t)INT32_MAX)
        return too_small(out, size);
    for (int bit = DELAYED_MAX_LEVEL; bit >= 0; bit--) {
        *p++ = (delay_s >> bit) & 1 ? '1' : '0';
        *p++ = '.';
    }
    memcpy(p, rk, rklen + 1);
    return (int)(need - 1);
}

int delayed_parse_routing_key(const char *key, size_t len, uint64_t *delay_s,
                              size_t *rk_off)
{
    uint64_t v = 0;
    if (!key || len <= 2 * DELAYED_LEVELS)
        return CR_EINVAL;
    for (int i = 0; i < DELAYED_LEVELS; i++) {
        char d = key[2 * i], dot = key[2 * i + 1];
        if ((d != '0' && d != '1') || dot != '.')
            return CR_EINVAL;
        v = v << 1 | (uint64_t)(d - '0');
    }
    *delay_s = v;
    *rk_off = 2 * DELAYED_LEVELS;
    return 0;
}

int delayed_level_binding(int level, int digit, char *out, size_t size)
{
    size_t stars, need;
    char *p = out;
    if (level < 0 || level > DELAYED_MAX_LEVEL || (digit != 0 && digit != 1))
        return CR_EINVAL;
    stars = (size_t)(DELAYED_MAX_LEVEL - level);
    need = 2 * stars + 4; /* "*." per star, "d.#", NUL */
    if (size < need)
        return too_small(out, size);
    for (size_t i = 0; i < stars; i++) {
        *p++ = '*';
        *p++ = '.';
    }
    *p++ = (char)('0' + digit);
    *p++ = '.';
    *p++ = '#';
    *p = '\0';
    return 0;
}

uint64_t delayed_delay_s(int64_t eta_us, int64_t now_us, double horizon_s)
{
    int64_t left_us;
    uint64_t s;
    if (eta_us < 0 || eta_us <= now_us)
        return 0;
    /* (no overflow: both are epoch microseconds of years 1..9999) */
    left_us = eta_us - now_us;
    if (horizon_s < 0)
        horizon_s = 0;
    if ((double)left_us <= horizon_s * 1e6)
        return 0;
    s = (uint64_t)(left_us / 1000000);
    if (s < 1)
        return 0;
    return s > DELAYED_MAX_S ? DELAYED_MAX_S : s;
}
