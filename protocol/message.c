/* message.c -- a delivery's allocation and release. */
#include "message.h"

#include "../util/alloc.h"

struct delivery *delivery_new(void)
{
    return cr_calloc(1, sizeof(struct delivery));
}

void delivery_free(struct delivery *d)
{
    if (!d)
        return;
    cr_free(d->body);
    cr_free(d->content_type);
    cr_free(d->content_encoding);
    cr_free(d->correlation_id);
    cr_free(d->reply_to);
    cr_free(d->expiration);
    cr_free(d->message_id);
    cr_free(d->exchange);
    cr_free(d->routing_key);
    cr_free(d->queue);
    cJSON_Delete(d->headers);
    cr_free(d->headers_err);
    cr_free(d->rec.id);
    cr_free(d);
}
