/* sqs_batch.c -- the pure parts of the SQS transport (sqs_broker_int.h):
 * held messages' tags, the back-off of a failed call, and the pending
 * settlements cut into batches. No I/O. */
#include "sqs_broker_int.h"

#include <string.h>

#include "protocol/sqs.h"
#include "util/alloc.h"

char *sqs_tag_new(const char *queue, const char *receipt)
{
    size_t q = strlen(queue), r = strlen(receipt);
    char *t = cr_malloc(q + r + 2);
    if (!t)
        return NULL;
    memcpy(t, queue, q);
    t[q] = ' ';
    memcpy(t + q + 1, receipt, r + 1);
    return t;
}

const char *sqs_tag_split(const char *tag, size_t *qlen)
{
    const char *sp = strchr(tag, ' ');
    if (!sp || sp == tag || !sp[1])
        return NULL;
    *qlen = (size_t)(sp - tag);
    return sp + 1;
}

struct sqs_pending *sqs_batch_take(struct sqs_pending **list, int *n)
{
    struct sqs_pending *first = *list, *batch = NULL, **tail = &batch, **pp = list;
    *n = 0;
    while (first && *pp && *n < SQS_BATCH_MAX) {
        struct sqs_pending *s = *pp;
        if (s->queue == first->queue && s->del == first->del) {
            *pp = s->next;
            s->next = NULL;
            *tail = s;
            tail = &s->next;
            (*n)++;
        } else {
            pp = &s->next;
        }
    }
    return batch;
}

unsigned sqs_backoff_ms(int attempt, unsigned cap_ms, double jitter)
{
    unsigned d = 200;
    for (int i = 1; i < attempt && d < cap_ms; i++)
        d *= 2;
    if (d > cap_ms)
        d = cap_ms;
    if (jitter < 0)
        jitter = 0;
    if (jitter > 1)
        jitter = 1;
    return d / 2 + (unsigned)(jitter * (double)(d / 2));
}
