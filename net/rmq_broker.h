/* rmq_broker.h -- the AMQP 0-9-1 transport behind net/broker.h: RabbitMQ through
 * rabbitmq-c, on the worker's libuv loop. broker_new() makes one for an
 * amqp:// URL (rmq_broker_new() in broker_int.h).
 *
 * Two connections, as RabbitMQ advises: one consumes and acks, the other
 * publishes (in confirm mode). RabbitMQ stops reading a connection that
 * publishes while a memory or disk alarm is on; on a connection of its own that
 * holds up publishes only, never the acks. Either connection lost is the
 * broker lost: both are closed and opened again together.
 *
 * Connecting (TCP, login, declarations, qos, consume) uses rabbitmq-c's
 * blocking calls with short timeouts; that happens at start-up and on reconnect
 * only. Afterwards frames are read when a socket is readable and assembled here
 * into whole deliveries; acks and publishes are small writes. A connection that
 * hears nothing from the broker for two heartbeat intervals is lost. Not
 * thread-safe: use on the loop thread only. */
#ifndef CR_RMQ_BROKER_H
#define CR_RMQ_BROKER_H

#include "broker.h"

#endif
