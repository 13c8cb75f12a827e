/* dlq_int.h -- what the two halves of `celeriac dlq` share: the options, the
 * filter and the printing (dlq.c), and the Redis broker's half (dlq_redis.c). */
#ifndef CR_DLQ_INT_H
#define CR_DLQ_INT_H

#include <stddef.h>
#include <cjson/cJSON.h>

struct dlq_opts {
    char *broker;
    char *transport_options; /* Redis: broker_transport_options JSON, or NULL */
    char *queue;
    char *task;   /* filter, or NULL */
    char *reason; /* substring filter, or NULL */
    char **ids;
    int nids;
    int json;
};

enum dlq_action { A_LIST, A_SHOW, A_REPLAY, A_PURGE };

/* A string header, "" when absent (borrowed from h). */
const char *dlq__hstr(const cJSON *h, const char *key);
/* s escaped for the terminal into out (see util/esc.h); returns out. */
const char *dlq__tty(const char *s, char *out, size_t size);
/* Whether the dead letter with headers h passes the task, reason and id filters. */
int dlq__matches(const struct dlq_opts *o, const cJSON *h);
void dlq__print_line(const struct dlq_opts *o, const cJSON *h);
void dlq__print_show(const cJSON *h, const char *content_type, size_t ct_len,
                     const char *body, size_t body_len);
/* Headers of a dead letter made ready to run again: celeriac's x-celeriac-*
 * entries and a quorum queue's x-delivery-count removed, the retry count back
 * at 0 (in place). */
void dlq__reset_headers(cJSON *h);

/* The closing words of an action over seen dead letters, acted on acted;
 * returns the exit code given rc (1 when show found nothing). */
int dlq__summary(const struct dlq_opts *o, enum dlq_action a, unsigned long acted,
                 unsigned long seen, int rc);

/* The action over a Redis broker (dlq_redis.c). Returns the exit code. */
int dlq__run_redis(const struct dlq_opts *o, enum dlq_action a);

#endif
