/* rl_headers.c -- providers' rate-limit headers (see rl_headers.h). */
#include "rl_headers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "protocol/isotime.h"
#include "util/err.h"

#define DAY_MS 86400000.0

static int is_space(char c)
{
    return c == ' ' || c == '\t';
}

/* The unit at s (n bytes left) in ms per unit, its length in *ulen; 0 when
 * there is none. "ms" before "m", "µs" as UTF-8. */
static double unit_at(const char *s, size_t n, size_t *ulen)
{
    static const struct {
        const char *name;
        double ms;
    } units[] = {{"ms", 1},      {"us", 1e-3}, {"\xc2\xb5s", 1e-3}, {"ns", 1e-6},
                 {"h", 3600000}, {"m", 60000}, {"s", 1000}};
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        size_t k = strlen(units[i].name);
        if (k <= n && !memcmp(s, units[i].name, k)) {
            *ulen = k;
            return units[i].ms;
        }
    }
    return 0;
}

int llm_rl_duration_ms(const char *s, size_t len, int64_t *ms)
{
    const char *p = s, *end = s + len;
    double total = 0;
    int parts = 0;

    if (!s)
        return CR_EINVAL;
    while (p < end && is_space(*p))
        p++;
    while (end > p && is_space(end[-1]))
        end--;
    if (p == end)
        return CR_EINVAL;
    while (p < end) {
        double v = 0, scale = 1, per;
        int digits = 0;
        size_t ulen = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (v < 1e12)
                v = v * 10 + (*p - '0');
            p++;
            digits++;
        }
        if (p < end && *p == '.') {
            p++;
            while (p < end && *p >= '0' && *p <= '9') {
                scale /= 10;
                v += (*p - '0') * scale;
                p++;
                digits++;
            }
        }
        if (!digits)
            return CR_EINVAL;
        if (p == end && parts == 0) {
            per = 1000; /* a bare number: seconds */
        } else if (!(per = unit_at(p, (size_t)(end - p), &ulen))) {
            return CR_EINVAL;
        }
        p += ulen;
        total += v * per;
        parts++;
        if (total > DAY_MS)
            return CR_EINVAL;
    }
    *ms = (int64_t)ceil(total - 1e-9);
    return 0;
}

int llm_rl_header_kind(const char *name, size_t len, int *which, int *is_reset)
{
    static const char *const kinds[4] = {"requests", "tokens", "input-tokens",
                                         "output-tokens"};
    static const char openai[] = "x-ratelimit-", anthropic[] = "anthropic-ratelimit-";
    for (int i = 0; i < 4; i++) {
        size_t k = strlen(kinds[i]);
        for (int r = 0; r < 2; r++) {
            const char *word = r ? "reset" : "remaining";
            size_t wl = strlen(word);
            /* x-ratelimit-remaining-requests */
            if (i < 2 && len == sizeof(openai) - 1 + wl + 1 + k &&
                !strncasecmp(name, openai, sizeof(openai) - 1) &&
                !strncasecmp(name + sizeof(openai) - 1, word, wl) &&
                name[sizeof(openai) - 1 + wl] == '-' &&
                !strncasecmp(name + sizeof(openai) + wl, kinds[i], k)) {
                *which = i;
                *is_reset = r;
                return 1;
            }
            /* anthropic-ratelimit-requests-remaining */
            if (len == sizeof(anthropic) - 1 + k + 1 + wl &&
                !strncasecmp(name, anthropic, sizeof(anthropic) - 1) &&
                !strncasecmp(name + sizeof(anthropic) - 1, kinds[i], k) &&
                name[sizeof(anthropic) - 1 + k] == '-' &&
                !strncasecmp(name + sizeof(anthropic) + k, word, wl)) {
                *which = i;
                *is_reset = r;
                return 1;
            }
        }
    }
    return 0;
}

/* A reset: a duration, or an RFC 3339 time counted from now. -1: unusable. */
static int64_t reset_ms(const char *v, int64_t now_epoch_ms)
{
    int64_t ms, us;
    if (!v)
        return -1;
    if (llm_rl_duration_ms(v, strlen(v), &ms) == 0)
        return ms;
    while (is_space(*v))
        v++;
    if (iso8601_parse(v, &us) == 0)
        return us / 1000 > now_epoch_ms ? us / 1000 - now_epoch_ms : 0;
    return -1;
}

/* 1 when v is a count of zero ("0", spaces around allowed). */
static int is_zero(const char *v)
{
    char *end;
    long n;
    if (!v)
        return 0;
    while (is_space(*v))
        v++;
    if (*v < '0' || *v > '9')
        return 0;
    n = strtol(v, &end, 10);
    while (is_space(*end))
        end++;
    return !*end && n == 0;
}

int64_t llm_rl_hold_ms(const struct llm_rl_headers *h, int64_t now_epoch_ms)
{
    int64_t hold = 0;
    for (int i = 0; i < 4; i++) {
        int64_t ms;
        if (!is_zero(h->remaining[i]) || (ms = reset_ms(h->reset[i], now_epoch_ms)) < 0)
            continue;
        if (ms > hold)
            hold = ms;
    }
    return hold > LLM_RL_MAX_HOLD_MS ? LLM_RL_MAX_HOLD_MS : hold;
}
