/* pidbox.c -- Celery remote control. NEEDSWORK: stub until issue 4 lands. */
#include "pidbox.h"

#include <stddef.h>

#include "broker.h"

struct pidbox *pidbox_new(struct worker *w)
{
    (void)w;
    return NULL;
}

void pidbox_on_message(struct pidbox *pb, struct broker_msg *m)
{
    (void)pb;
    broker_msg_free(m);
}

int pidbox_owns(const struct pidbox *pb, const struct broker_msg *m)
{
    (void)pb;
    return m->no_ack;
}

void pidbox_free(struct pidbox *pb)
{
    (void)pb;
}
