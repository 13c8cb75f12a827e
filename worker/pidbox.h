/* pidbox.h -- Celery remote control (inspect and control commands) over the
 * celery.pidbox fanout exchange. */
#ifndef CR_PIDBOX_H
#define CR_PIDBOX_H

struct worker;
struct broker_msg;

/* Returns a new mailbox for w: adds the <nodename>.celery.pidbox consumer. */
struct pidbox *pidbox_new(struct worker *w);
/* Handles one control message (takes m). */
void pidbox_on_message(struct pidbox *pb, struct broker_msg *m);
/* Whether m came from the mailbox queue. */
int pidbox_owns(const struct pidbox *pb, const struct broker_msg *m);
void pidbox_free(struct pidbox *pb);

#endif
