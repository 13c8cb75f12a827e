/* provider_drive.h -- test helper: feeds a response body through the framing a
 * provider asked for (sse.h or ndjson.h) into an llm_stream, in pieces of a
 * given size, as the client will. Static: included by the provider suites. */
#ifndef CR_TESTS_PROVIDER_DRIVE_H
#define CR_TESTS_PROVIDER_DRIVE_H

#include <stdint.h>
#include <string.h>

#include "llm/provider.h"
#include "protocol/ndjson.h"
#include "protocol/sse.h"
#include "util/buf.h"

/* step > 0: pieces of step bytes; 0: the whole body in one feed; < 0: random
 * sizes 1..17 from a fixed seed. Text deltas are appended to *deltas (if not
 * NULL). Returns the first error from the framing or the mapper, else 0. */
static int drive(struct llm_stream *s, enum llm_framing framing, const char *wire,
                 size_t len, long step, struct buf *deltas, struct cr_err *err)
{
    struct sse_parser *sp = framing == LLM_FRAMING_SSE ? sse_parser_new(1 << 20) : NULL;
    struct ndjson_parser *np =
        framing == LLM_FRAMING_NDJSON ? ndjson_parser_new(1 << 20) : NULL;
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    size_t off = 0;
    int rc = 0, more = 1;

    while (!rc && more) {
        size_t n = len - off;
        struct llm_frame f;
        const char *d;
        size_t dn;

        if (step > 0 && n > (size_t)step)
            n = (size_t)step;
        if (step < 0) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            if (n > 1 + seed % 17)
                n = 1 + seed % 17;
        }
        more = off + n < len;
        if (sp) {
            struct sse_event ev;
            int got;
            rc = sse_feed(sp, wire + off, n);
            while (!rc && (got = more ? sse_next(sp, &ev) : sse_finish(sp, &ev)) != 0) {
                if (got < 0) {
                    rc = got;
                    break;
                }
                f.event = ev.type;
                f.event_len = ev.type_len;
                f.data = ev.data;
                f.len = ev.data_len;
                rc = llm_stream_feed(s, &f, &d, &dn, err);
                if (!rc && deltas && dn)
                    buf_append(deltas, d, dn);
            }
        } else if (np) {
            const char *line;
            size_t ln;
            int got;
            rc = ndjson_feed(np, wire + off, n);
            while (!rc && (got = more ? ndjson_next(np, &line, &ln)
                                      : ndjson_finish(np, &line, &ln)) != 0) {
                if (got < 0) {
                    rc = got;
                    break;
                }
                memset(&f, 0, sizeof(f));
                f.data = line;
                f.len = ln;
                rc = llm_stream_feed(s, &f, &d, &dn, err);
                if (!rc && deltas && dn)
                    buf_append(deltas, d, dn);
            }
        } else {
            rc = CR_EINVAL;
        }
        off += n;
    }
    sse_parser_free(sp);
    ndjson_parser_free(np);
    return rc;
}

#endif
