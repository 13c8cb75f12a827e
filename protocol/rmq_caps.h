/* rmq_caps.h -- what a RabbitMQ server's announced version tells the worker
 * about it, read from connection.start's server-properties. Pure: no I/O.
 *
 * RabbitMQ 4.3 denies the deprecated global QoS by default, and denied it
 * answers basic.qos global=true without error but applies the window to each
 * consumer, and only to consumers started after it: the channel-wide window
 * the worker raises live for held eta tasks is then not there. Seen by hand
 * on RabbitMQ 4.0.5 with the feature denied in its configuration. */
#ifndef CR_RMQ_CAPS_H
#define CR_RMQ_CAPS_H

#include <stddef.h>

/* Reads "MAJOR.MINOR[...]" (as "4.3.0", "3.10.8", "4.3.0-rc.1") from the first
 * n bytes of s (not NUL-terminated). Returns 0 with *major and *minor set, or
 * CR_EINVAL when s does not start that way or a part passes 9999. */
int rmq_version_parse(const char *s, size_t n, int *major, int *minor);

/* 1 when a server announcing this version denies global QoS by default (4.3
 * and later), 0 otherwise, an unreadable version included: an old or unknown
 * server keeps what works on RabbitMQ 3.x. */
int rmq_global_qos_denied(const char *s, size_t n);

#endif
