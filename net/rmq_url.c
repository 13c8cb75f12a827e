/* rmq_url.c -- broker URL parsing (no I/O). */
#include "rmq_url.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/pct.h"

int rmq_url_parse(const char *url, struct rmq_url *out, struct cr_err *err)
{
    const char *p, *at, *hostend, *path;
    size_t n;

    memset(out, 0, sizeof(*out));
    snprintf(out->user, sizeof(out->user), "guest");
    snprintf(out->password, sizeof(out->password), "guest");
    snprintf(out->host, sizeof(out->host), "localhost");
    snprintf(out->vhost, sizeof(out->vhost), "/");
    out->port = 5672;
    if (!strncmp(url, "amqp://", 7))
        p = url + 7;
    else if (!strncmp(url, "pyamqp://", 9))
        p = url + 9;
    else
        return cr_err_set(err, CR_EINVAL, "unsupported broker URL scheme (want amqp://)");
    path = strchr(p, '/');
    n = path ? (size_t)(path - p) : strlen(p);
    at = memchr(p, '@', n);
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (pct_decode(out->user, sizeof(out->user), p,
                       colon ? (size_t)(colon - p) : (size_t)(at - p), 0, NULL))
            return cr_err_set(err, CR_EINVAL, "broker URL user name too long");
        if (colon && pct_decode(out->password, sizeof(out->password), colon + 1,
                                (size_t)(at - colon - 1), 0, NULL))
            return cr_err_set(err, CR_EINVAL, "broker URL password too long");
        n -= (size_t)(at + 1 - p);
        p = at + 1;
    }
    if (n && *p == '[') { /* [v6]:port */
        const char *close = memchr(p, ']', n);
        if (!close)
            return cr_err_set(err, CR_EINVAL, "broker URL has an unclosed '['");
        hostend = close + 1;
        if ((size_t)(close - p - 1) >= sizeof(out->host))
            return cr_err_set(err, CR_EINVAL, "broker host name too long");
        memcpy(out->host, p + 1, (size_t)(close - p - 1));
        out->host[close - p - 1] = '\0';
    } else {
        hostend = memchr(p, ':', n);
        if (!hostend)
            hostend = p + n;
        if (hostend > p) {
            if ((size_t)(hostend - p) >= sizeof(out->host))
                return cr_err_set(err, CR_EINVAL, "broker host name too long");
            memcpy(out->host, p, (size_t)(hostend - p));
            out->host[hostend - p] = '\0';
        }
    }
    if (hostend < p + n && *hostend == ':') {
        char *end;
        long port = strtol(hostend + 1, &end, 10);
        if (end == hostend + 1 || end != p + n || port <= 0 || port > 65535)
            return cr_err_set(err, CR_EINVAL, "invalid port in broker URL");
        out->port = (int)port;
    }
    if (path && path[1]) {
        size_t vn = strcspn(path + 1, "?");
        if (vn && pct_decode(out->vhost, sizeof(out->vhost), path + 1, vn, 0, NULL))
            return cr_err_set(err, CR_EINVAL, "broker URL vhost too long");
    }
    return 0;
}

int rmq_url_list_parse(const char *s, struct rmq_url_list *out, struct cr_err *err)
{
    struct rmq_url u;
    struct cr_err e2;

    out->n = 0;
    for (int i = 1;; i++) {
        size_t n = strcspn(s, ";");
        const char *b = s, *e = s + n;
        while (b < e && (*b == ' ' || *b == '\t'))
            b++;
        while (e > b && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if (b == e)
            return cr_err_set(err, CR_EINVAL, "broker URL list: entry %d is empty", i);
        if (out->n == RMQ_URL_LIST_MAX)
            return cr_err_set(err, CR_EINVAL, "broker URL list: more than %d URLs",
                              RMQ_URL_LIST_MAX);
        if ((size_t)(e - b) >= RMQ_URL_MAX_LEN)
            return cr_err_set(err, CR_EINVAL, "broker URL list: entry %d is too long", i);
        memcpy(out->url[out->n], b, (size_t)(e - b));
        out->url[out->n][e - b] = '\0';
        if (rmq_url_parse(out->url[out->n], &u, &e2))
            return cr_err_set(err, CR_EINVAL, "broker URL list: entry %d: %s", i, e2.msg);
        out->n++;
        if (!s[n])
            return 0;
        s += n + 1;
    }
}

int rmq_failover_parse(const char *name, enum rmq_failover *out, struct cr_err *err)
{
    if (!name || !*name || !strcmp(name, "round-robin") || !strcmp(name, "round_robin")) {
        *out = RMQ_FAILOVER_ROUND_ROBIN;
        return 0;
    }
    if (!strcmp(name, "shuffle")) {
        *out = RMQ_FAILOVER_SHUFFLE;
        return 0;
    }
    return cr_err_set(err, CR_EINVAL,
                      "invalid broker failover strategy '%s' (round-robin or shuffle)",
                      name);
}

int rmq_failover_next(enum rmq_failover s, int n, int cur, uint64_t rnd)
{
    if (n <= 1)
        return 0;
    if (s == RMQ_FAILOVER_SHUFFLE)
        return (int)((cur + 1 + (int)(rnd % (uint64_t)(n - 1))) % n);
    return (cur + 1) % n;
}
