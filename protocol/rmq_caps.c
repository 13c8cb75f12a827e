/* rmq_caps.c -- see rmq_caps.h. */
#include "protocol/rmq_caps.h"

#include "util/err.h"

/* One decimal part at s[*i], at most 4 digits; advances *i past it. */
static int part(const char *s, size_t n, size_t *i, int *out)
{
    int v = 0, digits = 0;
    while (*i < n && s[*i] >= '0' && s[*i] <= '9') {
        if (++digits > 4)
            return CR_EINVAL;
        v = v * 10 + (s[*i] - '0');
        (*i)++;
    }
    if (!digits)
        return CR_EINVAL;
    *out = v;
    return 0;
}

int rmq_version_parse(const char *s, size_t n, int *major, int *minor)
{
    size_t i = 0;
    int a, b;
    if (!s || part(s, n, &i, &a) || i >= n || s[i] != '.')
        return CR_EINVAL;
    i++;
    if (part(s, n, &i, &b))
        return CR_EINVAL;
    *major = a;
    *minor = b;
    return 0;
}

int rmq_global_qos_deniable(const char *s, size_t n)
{
    int major, minor;
    if (rmq_version_parse(s, n, &major, &minor))
        return 1;
    return major >= 4;
}

int rmq_consumer_timeout_arg(const char *s, size_t n)
{
    int major, minor;
    if (rmq_version_parse(s, n, &major, &minor))
        return 0;
    return major > 3 || (major == 3 && minor >= 12);
}
