/* amqp_url.h -- broker URLs as kombu reads them. Pure. */
#ifndef CR_AMQP_URL_H
#define CR_AMQP_URL_H

#include "util/err.h"

struct amqp_url {
    char host[256];
    int port;
    char user[128];
    char password[128];
    char vhost[256];
};

/* Parses "amqp://user:pass@host:port/vhost" (also "pyamqp://"). As in kombu,
 * the vhost is the percent-decoded text after the first '/' of the path, so
 * "amqp://h//" is vhost "/" and a missing vhost is "/". Defaults: guest,
 * guest, localhost, 5672. Returns 0 or CR_EINVAL with detail (the password is
 * never quoted). */
int amqp_url_parse(const char *url, struct amqp_url *out, struct cr_err *err);

#endif
