/* rmq_caps.h -- what a RabbitMQ server's announced version tells the worker
 * about it, read from connection.start's server-properties. Pure: no I/O.
 *
 * RabbitMQ 4.3 denies the deprecated global QoS by default, and so may a 4.0
 * to 4.2 node or a managed broker configured to. Denied, it answers basic.qos
 * global=true without error but applies the window to each consumer, and only
 * to consumers started after it (seen on RabbitMQ 4.0.5 with the feature
 * denied in its configuration). The version cannot say which: it only says
 * whether the question is worth asking the broker (net/rmq_broker.c probes). */
#ifndef CR_RMQ_CAPS_H
#define CR_RMQ_CAPS_H

#include <stddef.h>

/* Reads "MAJOR.MINOR[...]" (as "4.3.0", "3.10.8", "4.3.0-rc.1") from the first
 * n bytes of s (not NUL-terminated). Returns 0 with *major and *minor set, or
 * CR_EINVAL when s does not start that way or a part passes 9999. */
int rmq_version_parse(const char *s, size_t n, int *major, int *minor);

/* 1 when a server announcing this version may deny global QoS (4.0 and
 * later, and a version that cannot be read: a managed or other broker), 0 for
 * RabbitMQ 3.x and older, which always honour it. */
int rmq_global_qos_deniable(const char *s, size_t n);

/* 1 when a server announcing this version takes a per-consumer delivery
 * timeout (the x-consumer-timeout argument of basic.consume: RabbitMQ 3.12
 * and later), 0 otherwise, an unreadable version included (an unknown
 * argument is harmless, but an unknown broker is not assumed to honour it). */
int rmq_consumer_timeout_arg(const char *s, size_t n);

#endif
