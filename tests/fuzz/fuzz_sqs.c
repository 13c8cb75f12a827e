/* fuzz_sqs.c -- libFuzzer target: arbitrary bytes through the SQS wire codec
 * (protocol/sqs.c), as they reach it from the network or the configuration.
 *
 * Every input goes whole to sqs_body_decode (and, when it decodes, through
 * sqs_body_encode, base64 and raw, and back, which must give the same
 * fields), to every answer parser (ReceiveMessage, batch, QueueUrl,
 * GetQueueAttributes, SendMessage) and to sqs_error_parse with the first byte as part of
 * the status; each received message's Body goes through sqs_body_decode too.
 * Split at its first NUL it is a prefix and a queue for sqs_queue_name and a
 * request's strings (queue URL, receipt handle, message body). Every call must
 * return 0 or an error code, bounded in time and memory, and release cleanly
 * (ASan/LSan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/sqs.h"
#include "util/alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void round_trip(const struct kombu_msg *m)
{
    struct outbound o;
    struct kombu_msg back;
    struct buf out;
    kombu_msg_outbound(m, &o);
    for (int raw = 0; raw < 2; raw++) {
        buf_init(&out);
        if (sqs_body_encode(&o, m->delivery_tag, raw, 1u << 24, &out) != 0)
            abort();
        if (sqs_body_decode(&back, out.data, out.len, 1u << 24, NULL) != 0)
            abort();
        if (back.body_len != m->body_len ||
            memcmp(back.body, m->body, m->body_len) != 0 ||
            strcmp(back.delivery_tag, m->delivery_tag) != 0 ||
            strcmp(back.routing_key, m->routing_key) != 0)
            abort();
        kombu_msg_release(&back);
        buf_release(&out);
    }
}

static void strings(const char *a, const char *b, size_t blen)
{
    char name[SQS_QUEUE_NAME_MAX + 1];
    struct buf out;
    struct sqs_send s = {a, b, blen, -1, NULL, "d", 0};
    struct sqs_entry e = {"a", b, 0};
    struct sqs_receive r = {a, 10, 20, -1, NULL, 0};
    if (sqs_queue_name(a, b, name, sizeof name, NULL) == 0 && strlen(name) > 80)
        abort();
    sqs_url_queue_name(a, name, sizeof name);
    buf_init(&out);
    sqs_req_send(&out, &s, NULL);
    s.queue_url = "http://h/1/q.fifo";
    sqs_req_send(&out, &s, NULL);
    if (*b) {
        if (sqs_req_delete_batch(&out, "http://h/1/q", &e, 1, NULL) != 0 ||
            sqs_req_change_visibility(&out, "http://h/1/q", b, 0, NULL) != 0)
            abort();
    }
    sqs_req_receive(&out, &r, NULL);
    sqs_req_get_queue_url(&out, b, NULL);
    buf_release(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    struct kombu_msg m;
    struct sqs_messages ms;
    struct sqs_batch_result br;
    struct sqs_queue_attrs qa;
    struct sqs_sent sent;
    struct sqs_error e;
    char *url = NULL;
    const char *nul;

    cr_alloc_init();
    if (sqs_body_decode(&m, s, size, 0, NULL) == 0) {
        round_trip(&m);
        kombu_msg_release(&m);
    }
    if (sqs_parse_receive(s, size, 0, &ms, NULL) == 0) {
        if (ms.n < 0 || ms.n > SQS_BATCH_MAX)
            abort();
        for (int i = 0; i < ms.n; i++) {
            if (!ms.v[i].oversize &&
                sqs_md5_matches(ms.v[i].body, ms.v[i].body_len, ms.v[i].md5_of_body) > 1)
                abort();
            if (!ms.v[i].oversize &&
                sqs_body_decode(&m, ms.v[i].body, ms.v[i].body_len, 0, NULL) == 0)
                kombu_msg_release(&m);
        }
        sqs_messages_release(&ms);
    }
    if (sqs_parse_batch(s, size, &br, NULL) == 0 && br.n > 2 * SQS_BATCH_MAX)
        abort();
    if (sqs_parse_queue_url(s, size, &url, NULL) == 0 && !url)
        abort();
    cr_free(url);
    sqs_parse_queue_attrs(s, size, &qa, NULL);
    if (sqs_parse_send(s, size, &sent, NULL) == 0 && !sent.message_id[0])
        abort();
    sqs_error_parse(size ? 400 + data[0] % 200 : 0, NULL, s, size, &e);
    if ((unsigned)e.kind >= SQS_ERR_NKINDS)
        abort();

    nul = memchr(s, '\0', size);
    if (nul) {
        /* b borrows the rest, NUL-terminated in a copy */
        size_t bl = size - (size_t)(nul - s) - 1;
        char *b = malloc(bl + 1);
        if (!b)
            return 0;
        memcpy(b, nul + 1, bl);
        b[bl] = '\0';
        sqs_error_parse(503, s, b, bl, &e);
        strings(s, b, strlen(b));
        free(b);
    }
    return 0;
}
