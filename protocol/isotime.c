/* isotime.c -- ISO-8601 parsing and formatting with civil-date arithmetic (no libc time).
 */
#include "isotime.h"

#include <stdio.h>
#include <string.h>

#include "../util/err.h"

#define US_PER_SEC INT64_C(1000000)
#define SEC_PER_DAY INT64_C(86400)

/* Days since 1970-01-01 of a proleptic Gregorian date. Done by hand rather than
 * with timegm() so the result never depends on TZ, the locale or the libc: the
 * year is shifted to start in March, which puts the leap day last, and then
 * 400-year eras of 146097 days are counted. */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    int64_t era, yoe, doy, doe;
    y -= m <= 2;
    era = (y >= 0 ? y : y - 399) / 400;
    yoe = y - era * 400;
    doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* Inverse of days_from_civil(). */
static void civil_from_days(int64_t z, int64_t *y, int *m, int *d)
{
    int64_t era, doe, yoe, doy, mp;
    z += 719468;
    era = (z >= 0 ? z : z - 146096) / 146097;
    doe = z - era * 146097;
    yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

static int days_in_month(int64_t y, int m)
{
    static const int dim[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : dim[m - 1];
}

/* Reads exactly n ASCII digits (no sign, no locale) and advances *p. */
static int digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        char c = (*p)[i];
        if (c < '0' || c > '9')
            return -1;
        v = v * 10 + (c - '0');
    }
    *p += n;
    *out = v;
    return 0;
}

int iso8601_parse(const char *s, int64_t *epoch_us)
{
    int year, mon, day, hour, min, sec = 0, off_h = 0, off_m = 0;
    int64_t frac_us = 0, off_sec = 0, days;
    const char *p = s;

    if (!s || !epoch_us)
        return CR_EINVAL;
    if (digits(&p, 4, &year) || *p++ != '-' || digits(&p, 2, &mon) || *p++ != '-' ||
        digits(&p, 2, &day))
        return CR_EINVAL;
    if (*p != 'T' && *p != ' ')
        return CR_EINVAL;
    p++;
    if (digits(&p, 2, &hour) || *p++ != ':' || digits(&p, 2, &min))
        return CR_EINVAL;
    if (*p == ':') {
        p++;
        if (digits(&p, 2, &sec))
            return CR_EINVAL;
        if (*p == '.' || *p == ',') {
            /* Any number of digits; beyond microseconds they are dropped, the
             * same truncation Python's parsers apply. */
            int n = 0;
            p++;
            if (*p < '0' || *p > '9')
                return CR_EINVAL;
            for (; *p >= '0' && *p <= '9'; p++, n++)
                if (n < 6)
                    frac_us = frac_us * 10 + (*p - '0');
            for (; n < 6; n++)
                frac_us *= 10;
        }
    }
    if (*p == 'Z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p++ == '-' ? -1 : 1;
        if (digits(&p, 2, &off_h))
            return CR_EINVAL;
        if (*p == ':') {
            p++;
            if (digits(&p, 2, &off_m))
                return CR_EINVAL;
        } else if (*p >= '0' && *p <= '9') {
            if (digits(&p, 2, &off_m))
                return CR_EINVAL;
        }
        if (off_h > 23 || off_m > 59)
            return CR_EINVAL;
        off_sec = sign * (off_h * 3600 + off_m * 60);
    }
    if (*p != '\0')
        return CR_EINVAL;
    if (year < 1 || mon < 1 || mon > 12 || day < 1 || day > days_in_month(year, mon) ||
        hour > 23 || min > 59 || sec > 59)
        return CR_EINVAL;

    days = days_from_civil(year, mon, day);
    *epoch_us =
        ((days * SEC_PER_DAY + hour * 3600 + min * 60 + sec) - off_sec) * US_PER_SEC +
        frac_us;
    return 0;
}

void iso8601_format(int64_t epoch_us, char out[40])
{
    /* Floor division so that times before 1970 still get a positive fraction. */
    int64_t secs = epoch_us / US_PER_SEC, us = epoch_us % US_PER_SEC;
    int64_t days, rem, y;
    int m, d;
    char tmp[96];
    size_t n;
    if (us < 0) {
        us += US_PER_SEC;
        secs--;
    }
    days = secs / SEC_PER_DAY;
    rem = secs % SEC_PER_DAY;
    if (rem < 0) {
        rem += SEC_PER_DAY;
        days--;
    }
    civil_from_days(days, &y, &m, &d);
    /* Years beyond 9999 only come from absurd inputs (the int64 range ends in
     * year 294247); they get more digits rather than being cut. The text is built
     * in a larger buffer because the compiler cannot know that it fits in 40. */
    if (us)
        snprintf(tmp, sizeof(tmp), "%04lld-%02d-%02dT%02d:%02d:%02d.%06d+00:00",
                 (long long)y, m, d, (int)(rem / 3600), (int)(rem / 60 % 60),
                 (int)(rem % 60), (int)us);
    else
        snprintf(tmp, sizeof(tmp), "%04lld-%02d-%02dT%02d:%02d:%02d+00:00", (long long)y,
                 m, d, (int)(rem / 3600), (int)(rem / 60 % 60), (int)(rem % 60));
    n = strlen(tmp);
    if (n > 39)
        n = 39;
    memcpy(out, tmp, n);
    out[n] = '\0';
}
