/* amqp_url.h -- broker URLs as kombu reads them. Pure. */
#ifndef CR_AMQP_URL_H
#define CR_AMQP_URL_H

#include <stdint.h>

#include "util/err.h"

struct amqp_url {
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
int amqp_url_parse(const char *url, struct amqp_url *out, struct cr_err *err);

/* A failover list, kombu's "amqp://a;amqp://b;amqp://c": the URLs in the order
 * given, each checked by amqp_url_parse(). */
#define AMQP_URL_LIST_MAX 16
#define AMQP_URL_MAX_LEN 1024
struct amqp_url_list {
    int n;
    char url[AMQP_URL_LIST_MAX][AMQP_URL_MAX_LEN];
};

/* Splits s at ';' (blanks around each URL are dropped). Returns 0, or
 * CR_EINVAL with detail naming the entry (1-based, password never quoted): an
 * empty entry, more than AMQP_URL_LIST_MAX, one too long or invalid. */
int amqp_url_list_parse(const char *s, struct amqp_url_list *out, struct cr_err *err);

/* Celery's broker_failover_strategy. */
enum amqp_failover { AMQP_FAILOVER_ROUND_ROBIN, AMQP_FAILOVER_SHUFFLE };

/* "round-robin" (also "round_robin") or "shuffle": 0 and *out set, else
 * CR_EINVAL. NULL or "" is round-robin, Celery's default. */
int amqp_failover_parse(const char *name, enum amqp_failover *out, struct cr_err *err);

/* The URL to try after the one at cur failed or was lost, of n: round-robin
 * takes the next in turn; shuffle a random other one (rnd, any value from
 * the caller's generator), so that a lost node is never tried again straight
 * away while another is left. */
int amqp_failover_next(enum amqp_failover s, int n, int cur, uint64_t rnd);

#endif
