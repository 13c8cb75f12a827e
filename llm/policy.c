/* policy.c -- LLM failure classification, Retry-After parsing and backoff. */
#include "policy.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "util/rand.h"

#define DEFAULT_BASE_MS 1000
#define DEFAULT_FACTOR 2.0
#define DEFAULT_CAP_MS 60000
/* Larger server delays are clamped here (about 31 700 years) so that the
 * arithmetic below can never overflow int64_t. */
#define MAX_DELAY_MS 1e15

/* ---------------------------------------------------------- classification */

/* Configuration faults and our own aborts: retrying cannot help.
 * 1 UNSUPPORTED_PROTOCOL, 3 URL_MALFORMAT, 23 WRITE_ERROR (our write callback
 * refused the data), 42 ABORTED_BY_CALLBACK, 60 PEER_FAILED_VERIFICATION.
 * Every other curl failure (6, 7, 16, 18, 28, 35, 52, 55, 56, 92 and anything
 * unknown) is a transport problem and is retried, as both SDKs do. */
static int curl_permanent(int code)
{
    switch (code) {
    case 1:
    case 3:
    case 23:
    case 42:
    case 60:
        return 1;
    }
    return 0;
}

static int lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
}

/* Case-insensitive match of a header value against a word, ignoring the
 * surrounding spaces that header folding leaves behind. */
static int header_is(const char *v, const char *word)
{
    size_t n = strlen(word), i;

    while (*v == ' ' || *v == '\t')
        v++;
    for (i = 0; i < n; i++)
        if (lower((unsigned char)v[i]) != word[i])
            return 0;
    v += n;
    while (*v == ' ' || *v == '\t')
        v++;
    return *v == '\0';
}

static int is_quota(const char *s)
{
    return s && strcmp(s, "insufficient_quota") == 0;
}

enum llm_verdict llm_classify(int curl_code, long http_status, const char *error_code,
                              const char *error_type, const char *x_should_retry,
                              int stream_incomplete)
{
    if (curl_code != 0)
        return curl_permanent(curl_code) ? LLM_PERMANENT : LLM_RETRYABLE;
    if (http_status >= 200 && http_status < 300 && !stream_incomplete)
        return LLM_OK;
    /* No credit left will not change by waiting, whatever the server hints. */
    if (http_status == 429 && (is_quota(error_code) || is_quota(error_type)))
        return LLM_PERMANENT;
    if (x_should_retry && header_is(x_should_retry, "true"))
        return LLM_RETRYABLE;
    if (x_should_retry && header_is(x_should_retry, "false"))
        return LLM_PERMANENT;
    if (http_status >= 200 && http_status < 300)
        return LLM_RETRYABLE; /* stream_incomplete: cut short or error payload */
    if (http_status == 408 || http_status == 409 || http_status == 429)
        return LLM_RETRYABLE;
    if (http_status >= 500)
        return LLM_RETRYABLE;
    if (http_status >= 300)
        return LLM_PERMANENT; /* other 4xx, and 3xx we were told not to follow */
    /* 0 (no response although curl reported success) or a stray 1xx: the
     * exchange broke, nothing says the request itself is bad. */
    return LLM_RETRYABLE;
}

/* ------------------------------------------------------------ Retry-After */

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Parses "[+-]digits[.digits]" with optional surrounding spaces, without
 * strtod so that the process locale cannot change the decimal point.
 * Returns 0 and *out, or -1. */
static int parse_decimal(const char *s, double *out)
{
    double v = 0, scale = 1;
    int neg = 0, digits = 0;

    while (*s == ' ' || *s == '\t')
        s++;
    if (*s == '+' || *s == '-')
        neg = *s++ == '-';
    for (; is_digit(*s); s++, digits++)
        if (v < MAX_DELAY_MS)
            v = v * 10 + (*s - '0');
    if (*s == '.') {
        for (s++; is_digit(*s); s++, digits++) {
            scale /= 10;
            v += (*s - '0') * scale;
        }
    }
    while (*s == ' ' || *s == '\t')
        s++;
    if (!digits || *s)
        return -1;
    *out = neg ? -v : v;
    return 0;
}

/* Rounds a delay up (never retry earlier than asked), floors it at 0 and
 * clamps it. */
static int64_t to_ms(double ms)
{
    if (!(ms > 0))
        return 0;
    if (ms > MAX_DELAY_MS)
        ms = MAX_DELAY_MS;
    return (int64_t)ceil(ms);
}

static int is_leap(int y)
{
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

/* Leap years in [1, y). */
static int64_t leaps_before(int y)
{
    int64_t p = y - 1;
    return p / 4 - p / 100 + p / 400;
}

/* Days from 1970-01-01 to y-m-d (Gregorian, 1 <= y <= 9999): whole years,
 * their leap days, then whole months of year y. Avoids timegm(), which is not
 * C11 and would drag the TZ environment into a pure module. */
static int64_t days_since_epoch(int y, int m, int d)
{
    static const int before_month[12] = {0,   31,  59,  90,  120, 151,
                                         181, 212, 243, 273, 304, 334};
    int64_t days = (int64_t)(y - 1970) * 365 + leaps_before(y) - leaps_before(1970);
    days += before_month[m - 1] + (m > 2 && is_leap(y)) + d - 1;
    return days;
}

static int days_in_month(int y, int m)
{
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return m == 2 && is_leap(y) ? 29 : days[m - 1];
}

/* Reads exactly n digits. */
static int fixed_digits(const char **s, int n, int *out)
{
    int v = 0, i;
    for (i = 0; i < n; i++) {
        if (!is_digit((*s)[i]))
            return -1;
        v = v * 10 + ((*s)[i] - '0');
    }
    *s += n;
    *out = v;
    return 0;
}

static int expect(const char **s, const char *lit)
{
    size_t n = strlen(lit);
    if (strncmp(*s, lit, n) != 0)
        return -1;
    *s += n;
    return 0;
}

static int find_name(const char **s, const char *const *names, int count)
{
    int i;
    for (i = 0; i < count; i++) {
        if (strncmp(*s, names[i], 3) == 0) {
            *s += 3;
            return i;
        }
    }
    return -1;
}

/* Parses an IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT", RFC 9110 5.6.7) by
 * hand: strptime and %a/%b depend on the locale. The weekday is checked for
 * spelling only. The obsolete RFC 850 and asctime forms are not accepted.
 * Returns 0 and the epoch time in ms, or -1. */
static int parse_http_date(const char *s, int64_t *epoch_ms)
{
    static const char *const wdays[7] = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
    static const char *const months[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                           "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    int day, mon, year, hh, mm, ss;

    while (*s == ' ' || *s == '\t')
        s++;
    if (find_name(&s, wdays, 7) < 0 || expect(&s, ", ") < 0)
        return -1;
    if (fixed_digits(&s, 2, &day) < 0 || expect(&s, " ") < 0)
        return -1;
    mon = find_name(&s, months, 12) + 1;
    if (mon < 1 || expect(&s, " ") < 0 || fixed_digits(&s, 4, &year) < 0)
        return -1;
    if (expect(&s, " ") < 0 || fixed_digits(&s, 2, &hh) < 0 || expect(&s, ":") < 0 ||
        fixed_digits(&s, 2, &mm) < 0 || expect(&s, ":") < 0 ||
        fixed_digits(&s, 2, &ss) < 0 || expect(&s, " GMT") < 0)
        return -1;
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s)
        return -1;
    /* 60 is a leap second; it reads as the first second of the next minute. */
    if (year < 1 || day < 1 || day > days_in_month(year, mon) || hh > 23 || mm > 59 ||
        ss > 60)
        return -1;
    *epoch_ms = ((days_since_epoch(year, mon, day) * 24 + hh) * 60 + mm) * 60000 +
                (int64_t)ss * 1000;
    return 0;
}

int64_t llm_retry_after_ms(const char *retry_after_ms, const char *retry_after,
                           int64_t now_epoch_ms)
{
    double v;
    int64_t when;

    if (retry_after_ms && parse_decimal(retry_after_ms, &v) == 0)
        return to_ms(v);
    if (!retry_after)
        return -1;
    if (parse_decimal(retry_after, &v) == 0)
        return to_ms(v * 1000);
    if (parse_http_date(retry_after, &when) == 0)
        return to_ms((double)when - (double)now_epoch_ms);
    return -1;
}

/* ---------------------------------------------------------------- backoff */

int64_t llm_backoff_ms(const struct llm_backoff *b, int retries, uint64_t *seed)
{
    double base = b->base_ms > 0 ? (double)b->base_ms : DEFAULT_BASE_MS;
    double factor = b->factor > 0 ? b->factor : DEFAULT_FACTOR;
    double cap = b->cap_ms > 0 ? (double)b->cap_ms : DEFAULT_CAP_MS;
    double d;
    int64_t ms;

    if (retries < 0)
        retries = 0;
    d = base * pow(factor, retries); /* may be inf: the cap handles it */
    if (!(d < cap))
        d = cap;
    ms = (int64_t)d;
    if (!b->jitter || !seed || ms <= 1)
        return ms;
    /* Full jitter over (0, d]: 0 is excluded so a retry never fires in the
     * same loop turn as the failure. Modulo bias is below 2^-40 here. */
    return (int64_t)(cr_xorshift64(seed) % (uint64_t)ms) + 1;
}
