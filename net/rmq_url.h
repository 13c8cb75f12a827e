/* rmq_url.h -- broker URLs as kombu reads them. Pure. */
#ifndef CR_RMQ_URL_H
#define CR_RMQ_URL_H

#include <stdint.h>

#include "util/err.h"

struct rmq_url {
    char host[256];
    int port;
    char user[128];
    char password[128];
    char vhost[256];
};

/* Parses "amqp://user:pass@host:port/vhost" (also "pyamqp://"). As in kombu,
 * the vhost is the percent-decoded text after the first '/' of the path, so
 * "amqp://h//" is vhost "/" and a missing vhost is "/". Defaults: guest,
 * guest, localhost, 5672. Returns 0 or CR_EINVAL with detail (the password is
 * never quoted). */
int rmq_url_parse(const char *url, struct rmq_url *out, struct cr_err *err);

/* A failover list, kombu's "amqp://a;amqp://b;amqp://c": the URLs in the order
 * given, each checked by rmq_url_parse(). */
#define RMQ_URL_LIST_MAX 16
#define RMQ_URL_MAX_LEN 1024
struct rmq_url_list {
    int n;
    char url[RMQ_URL_LIST_MAX][RMQ_URL_MAX_LEN];
};

/* Splits s at ';' (blanks around each URL are dropped). Returns 0, or
 * CR_EINVAL with detail naming the entry (1-based, password never quoted): an
 * empty entry, more than RMQ_URL_LIST_MAX, one too long or invalid. */
int rmq_url_list_parse(const char *s, struct rmq_url_list *out, struct cr_err *err);

/* Celery's broker_failover_strategy. */
enum rmq_failover { RMQ_FAILOVER_ROUND_ROBIN, RMQ_FAILOVER_SHUFFLE };

/* "round-robin" (also "round_robin") or "shuffle": 0 and *out set, else
 * CR_EINVAL. NULL or "" is round-robin, Celery's default. */
int rmq_failover_parse(const char *name, enum rmq_failover *out, struct cr_err *err);

/* The URL to try after the one at cur failed or was lost, of n: round-robin
 * takes the next in turn; shuffle a random other one (rnd, any value from
 * the caller's generator), so that a lost node is never tried again straight
 * away while another is left. */
int rmq_failover_next(enum rmq_failover s, int n, int cur, uint64_t rnd);

#endif
