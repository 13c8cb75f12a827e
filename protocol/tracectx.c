/* tracectx.c -- W3C traceparent / tracestate parsing and formatting, span ids. */
#include "tracectx.h"

#include <string.h>

#include "../util/err.h"

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1; /* upper case is not allowed by the W3C text */
}

/* n bytes from 2n lowercase hex digits; -1 on any other character. */
static int unhex(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

int tracectx_id_is_zero(const uint8_t *id, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (id[i])
            return 0;
    return 1;
}

int tracectx_parse_traceparent(struct trace_ctx *c, const char *s, size_t n)
{
    uint8_t version, tid[TRACE_ID_BYTES], sid[SPAN_ID_BYTES], flags;

    if (!s || n < TRACEPARENT_LEN)
        return CR_EPROTO;
    if (unhex(s, &version, 1) || version == 0xff)
        return CR_EPROTO;
    /* Version 00 has exactly this length; a later one may add fields after
     * a dash, which a 00 reader skips. */
    if (version == 0 && n != TRACEPARENT_LEN)
        return CR_EPROTO;
    if (n > TRACEPARENT_LEN && s[TRACEPARENT_LEN] != '-')
        return CR_EPROTO;
    if (s[2] != '-' || s[35] != '-' || s[52] != '-')
        return CR_EPROTO;
    if (unhex(s + 3, tid, sizeof(tid)) || unhex(s + 36, sid, sizeof(sid)) ||
        unhex(s + 53, &flags, 1))
        return CR_EPROTO;
    if (tracectx_id_is_zero(tid, sizeof(tid)) || tracectx_id_is_zero(sid, sizeof(sid)))
        return CR_EPROTO;
    memcpy(c->trace_id, tid, sizeof(tid));
    memcpy(c->span_id, sid, sizeof(sid));
    c->flags = flags;
    return 0;
}

void tracectx_hex(const uint8_t *id, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[id[i] >> 4];
        out[2 * i + 1] = digits[id[i] & 15];
    }
    out[2 * n] = '\0';
}

void tracectx_format_traceparent(const struct trace_ctx *c, char out[TRACEPARENT_LEN + 1])
{
    memcpy(out, "00-", 3);
    tracectx_hex(c->trace_id, TRACE_ID_BYTES, out + 3);
    out[35] = '-';
    tracectx_hex(c->span_id, SPAN_ID_BYTES, out + 36);
    out[52] = '-';
    tracectx_hex(&c->flags, 1, out + 53);
}

int tracectx_set_state(struct trace_ctx *c, const char *s, size_t n)
{
    size_t len = 0, members = 0, i = 0;
    int full = 0;

    c->state[0] = '\0';
    if (!s)
        return CR_EPROTO;
    for (size_t k = 0; k < n; k++)
        if (((unsigned char)s[k] < 0x20 && s[k] != '\t') || (unsigned char)s[k] > 0x7e)
            return CR_EPROTO;
    /* Members in order, without the optional white space around them; the
     * first member that would overflow the bound ends the copy (the ones
     * after it are dropped), but the 32-member rule counts them all. */
    while (i < n) {
        size_t a = i, b;
        while (i < n && s[i] != ',')
            i++;
        b = i++;
        while (a < b && (s[a] == ' ' || s[a] == '\t'))
            a++;
        while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t'))
            b--;
        if (a == b)
            continue;
        if (++members > TRACESTATE_MAX_MEMBERS) {
            c->state[0] = '\0';
            return CR_EPROTO;
        }
        if (full || len + (len ? 1 : 0) + (b - a) > TRACESTATE_MAX) {
            full = 1;
            continue;
        }
        if (len)
            c->state[len++] = ',';
        memcpy(c->state + len, s + a, b - a);
        len += b - a;
        c->state[len] = '\0';
    }
    return c->state[0] ? 0 : CR_EPROTO;
}

/* splitmix64 (Steele, Lea, Flood 2014): one multiply-xorshift step per word,
 * good enough for ids that must be unique, not secret. */
void trace_rng_seed(struct trace_rng *r, uint64_t seed)
{
    r->s = seed;
}

uint64_t trace_rng_next(struct trace_rng *r)
{
    uint64_t z = (r->s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static void fill(struct trace_rng *r, uint8_t *out, size_t n)
{
    do {
        for (size_t i = 0; i < n; i += 8) {
            uint64_t v = trace_rng_next(r);
            for (size_t k = 0; k < 8 && i + k < n; k++)
                out[i + k] = (uint8_t)(v >> (8 * k));
        }
    } while (tracectx_id_is_zero(out, n));
}

void trace_rng_trace_id(struct trace_rng *r, uint8_t out[TRACE_ID_BYTES])
{
    fill(r, out, TRACE_ID_BYTES);
}

void trace_rng_span_id(struct trace_rng *r, uint8_t out[SPAN_ID_BYTES])
{
    fill(r, out, SPAN_ID_BYTES);
}
