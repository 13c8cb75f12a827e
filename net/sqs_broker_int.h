/* sqs_broker_int.h -- the pure parts of the SQS transport (net/sqs_broker.c),
 * in net/sqs_batch.c, apart so that they are unit-tested alone. No I/O. */
#ifndef CR_SQS_BROKER_INT_H
#define CR_SQS_BROKER_INT_H

#include <stddef.h>

/* A held message's tag in the session (net/vsession.h): its SQS queue name,
 * a space, its receipt handle. Queue names have no space, so an ack, which
 * carries only the tag, finds both. Returns a new string (cr_free()), or
 * NULL when out of memory. */
char *sqs_tag_new(const char *queue, const char *receipt);

/* The receipt handle in tag (borrowed from it), with the queue name's length
 * in *qlen; NULL when tag has no space or an empty part. */
const char *sqs_tag_split(const char *tag, size_t *qlen);

/* The back-off before attempt n (1 = the first retry) of a failed call, in
 * ms: 200 ms doubling, at most cap_ms; jitter in 0..1 scales the upper half
 * (full delay = d/2 + jitter * d/2), so retries of many workers spread. */
unsigned sqs_backoff_ms(int attempt, unsigned cap_ms, double jitter);

/* A settlement waiting to be sent: a node of the transport's pending list,
 * the first member of its own record. queue is compared by address. */
struct sqs_pending {
    struct sqs_pending *next;
    const void *queue;
    int del; /* 1: DeleteMessageBatch; 0: ChangeMessageVisibilityBatch */
};

/* Takes the next batch off *list: the first node and the nodes after it of
 * the same queue and kind, at most SQS_BATCH_MAX, in their order, the others
 * left in theirs. Returns the batch as a list (NULL when *list is empty) and
 * its length in *n. */
struct sqs_pending *sqs_batch_take(struct sqs_pending **list, int *n);

#endif
