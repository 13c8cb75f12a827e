/* dlq_int.h -- what the parts of `celeriac dlq` share: the options, the
 * filter and the printing (dlq.c), the Redis broker's part (dlq_redis.c) and
 * the SQS broker's (dlq_sqs.c). */
#ifndef CR_DLQ_INT_H
#define CR_DLQ_INT_H

#include <stddef.h>
#include <cjson/cJSON.h>

struct dlq_opts {
    char *broker;
    char *transport_options; /* Redis, SQS: broker_transport_options JSON, or NULL */
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
/* The column heads of a plain list (nothing for another action or --json). */
void dlq__print_head(const struct dlq_opts *o, enum dlq_action a);
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

/* The action over an SQS broker (dlq_sqs.c). Returns the exit code. */
int dlq__run_sqs(const struct dlq_opts *o, enum dlq_action a);

/* A received dead letter's visibility while the command looks (given back
 * at its end); a scan of the queue stops after this many dead letters or
 * this long, well inside that hold (dlq_sqs.c). */
#define DLQ_SQS_HOLD_S 60
#define DLQ_SQS_SCAN_MAX 5000
#define DLQ_SQS_SCAN_MS 30000

/* The Celery queue a dead letter on SQS goes back to (borrowed from h), or
 * NULL when its headers do not say: as the worker publishes on SQS, the
 * routing key names the queue when the exchange is the nameless one; else
 * the queue it was consumed from, else the routing key. */
const char *dlq__sqs_target(const cJSON *h);

/* The WaitTimeSeconds of the next ReceiveMessage of a scan, or -1 to stop:
 * after a page of got messages (received with last_wait_s), seen in all
 * since the scan began elapsed_ms ago. A short poll (0) while pages come;
 * an empty one is confirmed by a long poll of 1 s (a short poll samples only
 * some of SQS's servers), whose emptiness ends the scan; and the caps. */
int dlq__sqs_next_wait(int got, int last_wait_s, unsigned long seen, long elapsed_ms);

#endif
