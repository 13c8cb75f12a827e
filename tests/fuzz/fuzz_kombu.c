/* fuzz_kombu.c -- libFuzzer target: arbitrary bytes through the Redis
 * transport's wire codec (protocol/kombu.c), as they reach it from Redis or
 * from the configuration.
 *
 * Every input goes whole to kombu_msg_decode (and, when it decodes, through
 * kombu_msg_encode and back, which must give the same fields),
 * kombu_mark_redelivered, kombu_unacked_decode, kombu_opts_parse and
 * kombu_channel_parse; split at its first NUL byte it is a binding key and a
 * routing key for kombu_topic_match and kombu_topic_pattern. Every call must
 * return 0 or an error code, bounded in time and memory, and release cleanly
 * (ASan/LSan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/kombu.h"
#include "util/alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void round_trip(const struct kombu_msg *m)
{
    struct outbound o;
    struct kombu_msg back;
    struct buf out;
    kombu_msg_outbound(m, &o);
    buf_init(&out);
    if (kombu_msg_encode(&o, m->delivery_tag, &out) == 0 &&
        kombu_msg_decode(&back, out.data, out.len, 0, NULL) == 0) {
        if (back.body_len != m->body_len ||
            memcmp(back.body, m->body, m->body_len) != 0 ||
            strcmp(back.delivery_tag, m->delivery_tag) != 0 ||
            strcmp(back.routing_key, m->routing_key) != 0 || back.priority != m->priority)
            abort();
        kombu_msg_release(&back);
    } else if (out.len) {
        /* Encoding what we decoded must decode (invalid UTF-8 in a string
         * is written as U+FFFD, never as bytes py_json_parse refuses). */
        abort();
    }
    buf_release(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    struct kombu_msg m;
    struct kombu_opts o;
    struct buf out;
    char *env, *ex, *rk;
    char exb[64], rkb[64];
    const char *nul;

    cr_alloc_init();
    if (kombu_msg_decode(&m, s, size, 1 << 20, NULL) == 0) {
        round_trip(&m);
        kombu_msg_release(&m);
    }
    buf_init(&out);
    kombu_mark_redelivered(s, size, &out, NULL);
    buf_release(&out);
    if (kombu_unacked_decode(s, size, &env, &ex, &rk, NULL) == 0) {
        buf_init(&out);
        if (kombu_unacked_encode(env, strlen(env), ex, rk, &out, NULL) != 0)
            abort();
        buf_release(&out);
        cr_free(env);
        cr_free(ex);
        cr_free(rk);
    }
    kombu_opts_init(&o);
    kombu_opts_parse(&o, s, size, NULL);
    kombu_opts_init(&o);
    kombu_channel_parse(&o, s, size, exb, sizeof exb, rkb, sizeof rkb);

    nul = memchr(s, '\0', size);
    if (nul) {
        size_t bl = (size_t)(nul - s);
        kombu_topic_match(s, bl, nul + 1, size - bl - 1);
        buf_init(&out);
        kombu_topic_pattern(s, &out);
        buf_release(&out);
    }
    return 0;
}
