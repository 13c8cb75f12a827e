/* sqs_broker_int.h -- the pure arithmetic of the SQS transport
 * (net/sqs_broker.c), apart so that it is unit-tested alone. No I/O. */
#ifndef CR_SQS_BROKER_INT_H
#define CR_SQS_BROKER_INT_H

/* MaxNumberOfMessages for the next ReceiveMessage: what the prefetch window
 * (prefetch; 0 = none) still has room for, with held messages received and
 * not settled, and asked already requested by polls in flight, at most
 * SQS_BATCH_MAX. 0 means no poll now. */
int sqs_receive_room(int prefetch, int held, int asked);

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
