/* openai.c -- OpenAI-compatible response mapping (chunks, bodies, errors). */
#include "openai.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../util/alloc.h"

/* How much of a bad payload to quote in an error message. */
#define QUOTE_BYTES 60

/* ---------------------------------------------------------------- helpers */

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static int is_blank(const char *s, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (!is_space(s[i]))
            return 0;
    return 1;
}

/* Copies at most cap-1 bytes and NUL-terminates. Cuts before a UTF-8
 * continuation byte so a truncated message never ends in half a character. */
static void copy_text(char *dst, size_t cap, const char *src, size_t n)
{
    if (n >= cap) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
            n--;
    }
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    copy_text(dst, cap, src, strlen(src));
}

/* Integral numbers print without a fraction, so an HTTP status in "code"
 * reads "400" rather than "400.0". */
static void number_text(char *dst, size_t cap, double d)
{
    if (d >= -9.0e18 && d <= 9.0e18 && d == (double)(long long)d)
        snprintf(dst, cap, "%lld", (long long)d);
    else
        snprintf(dst, cap, "%g", d);
}

/* Fills dst from a string, number or boolean item; leaves it alone otherwise. */
static void scalar_text(char *dst, size_t cap, const cJSON *item)
{
    if (cJSON_IsString(item))
        copy_str(dst, cap, item->valuestring);
    else if (cJSON_IsNumber(item))
        number_text(dst, cap, item->valuedouble);
    else if (cJSON_IsBool(item))
        copy_str(dst, cap, cJSON_IsTrue(item) ? "true" : "false");
}

static const cJSON *get(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

static const char *get_str(const cJSON *obj, const char *key)
{
    const cJSON *it = get(obj, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* Token counts are clamped so a hostile 1e300 cannot overflow a long. */
static long get_count(const cJSON *obj, const char *key)
{
    const cJSON *it = get(obj, key);
    double d;
    if (!cJSON_IsNumber(it))
        return -1;
    d = it->valuedouble;
    if (!(d >= 0))
        return -1;
    if (d > 1e15)
        d = 1e15;
    return (long)d;
}

/* Parses a whole JSON object; trailing non-space bytes are an error (cJSON
 * alone would accept "{}junk"). cJSON cannot tell an allocation failure from a
 * syntax error, so both come back as CR_EPROTO.
 * NEEDSWORK: report CR_ENOMEM when the parse failed for lack of memory. */
static cJSON *parse_object(const char *txt, size_t len, const char *what,
                           struct cr_err *err)
{
    const char *end = NULL;
    cJSON *root = NULL;
    int n = (int)(len < QUOTE_BYTES ? len : QUOTE_BYTES);

    if (len > 0)
        root = cJSON_ParseWithLengthOpts(txt, len, &end, 0);
    if (root && !is_blank(end, len - (size_t)(end - txt))) {
        cJSON_Delete(root);
        root = NULL;
    }
    if (!root) {
        cr_err_set(err, CR_EPROTO, "%s is not valid json: '%.*s'", what, n, txt);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        cr_err_set(err, CR_EPROTO, "%s is not a json object: '%.*s'", what, n, txt);
        return NULL;
    }
    return root;
}

/* ----------------------------------------------------------------- errors */

/* True for {"error":{...non-empty}}, {"error":"text"}, the flat vLLM
 * {"object":"error",...} and Anthropic-style {"type":"error",...}. */
static int is_error_payload(const cJSON *root)
{
    const cJSON *e = get(root, "error");
    const char *obj = get_str(root, "object");
    const char *type = get_str(root, "type");

    if (cJSON_IsObject(e) && e->child)
        return 1;
    if (cJSON_IsString(e) && e->valuestring[0])
        return 1;
    return (obj && strcmp(obj, "error") == 0) || (type && strcmp(type, "error") == 0);
}

/* The JSON part of openai_error_parse(): error.message, then "error" as a
 * string, then a top-level "message". Returns 1 when a message was found. */
static int json_error(const cJSON *root, struct openai_error *out)
{
    const cJSON *e = get(root, "error");
    const char *msg = NULL;

    if (cJSON_IsObject(e)) {
        scalar_text(out->type, sizeof(out->type), get(e, "type"));
        scalar_text(out->code, sizeof(out->code), get(e, "code"));
        msg = get_str(e, "message");
    } else if (cJSON_IsString(e) && e->valuestring[0]) {
        msg = e->valuestring;
    }
    if (!msg)
        msg = get_str(root, "message");
    /* The inner error type wins: Anthropic's top-level "type" is just "error". */
    if (!out->type[0])
        scalar_text(out->type, sizeof(out->type), get(root, "type"));
    if (!out->code[0])
        scalar_text(out->code, sizeof(out->code), get(root, "code"));
    if (!msg)
        return 0;
    copy_str(out->message, sizeof(out->message), msg);
    return 1;
}

static void raw_error(const char *body, size_t len, struct openai_error *out)
{
    while (len > 0 && is_space(body[0])) {
        body++;
        len--;
    }
    while (len > 0 && is_space(body[len - 1]))
        len--;
    copy_text(out->message, sizeof(out->message), body, len);
}

void openai_error_parse(const char *body, size_t len, struct openai_error *out)
{
    cJSON *root;
    int found = 0;

    memset(out, 0, sizeof(*out));
    if (!body)
        return;
    root = parse_object(body, len, "error body", NULL);
    if (root) {
        found = json_error(root, out);
        cJSON_Delete(root);
    }
    if (!found)
        raw_error(body, len, out);
}

/* ----------------------------------------------------------------- stream */

void openai_stream_init(struct openai_stream *s)
{
    memset(s, 0, sizeof(*s));
    buf_init(&s->content);
    s->prompt_tokens = -1;
    s->completion_tokens = -1;
    s->total_tokens = -1;
}

void openai_stream_release(struct openai_stream *s)
{
    buf_release(&s->content);
}

static void set_error(struct openai_stream *s, const cJSON *root, const char *data,
                      size_t len)
{
    struct openai_error e;

    memset(&e, 0, sizeof(e));
    if (!json_error(root, &e))
        raw_error(data, len, &e);
    s->error = 1;
    copy_str(s->error_type, sizeof(s->error_type), e.type);
    copy_str(s->error_code, sizeof(s->error_code), e.code);
    copy_str(s->error_message, sizeof(s->error_message), e.message);
}

/* A usage object replaces the previous one as a whole: vLLM's continuous
 * usage is cumulative, so adding chunks up would over-count. */
static void apply_usage(struct openai_stream *s, const cJSON *root)
{
    const cJSON *u = get(root, "usage");

    if (!cJSON_IsObject(u))
        return;
    s->prompt_tokens = get_count(u, "prompt_tokens");
    s->completion_tokens = get_count(u, "completion_tokens");
    s->total_tokens = get_count(u, "total_tokens");
    if (s->total_tokens < 0 && s->prompt_tokens >= 0 && s->completion_tokens >= 0)
        s->total_tokens = s->prompt_tokens + s->completion_tokens;
}

static void apply_model(struct openai_stream *s, const cJSON *root)
{
    const char *m = get_str(root, "model");
    /* Azure's filter-only chunk carries "model":"" and must not blank it. */
    if (m && m[0])
        copy_str(s->model, sizeof(s->model), m);
}

/* Returns choice 0: the element whose "index" is 0, or the first element when
 * indexes are absent. With n>1 the other choices' text is not ours to mix in. */
static const cJSON *choice0(const cJSON *choices)
{
    const cJSON *c;
    int pos = 0;

    cJSON_ArrayForEach(c, choices)
    {
        const cJSON *idx = get(c, "index");
        if (cJSON_IsObject(c)) {
            if (cJSON_IsNumber(idx) ? idx->valuedouble == 0 : pos == 0)
                return c;
        }
        pos++;
    }
    return NULL;
}

/* Appends the choice's text (held in `holder` under "content", or directly
 * under "text" for legacy completions) and records its finish_reason. */
static int apply_choice(struct openai_stream *s, const cJSON *choice, const char *holder)
{
    const cJSON *h = get(choice, holder);
    const char *text = NULL, *fin;
    int rc;

    if (cJSON_IsObject(h))
        text = get_str(h, "content");
    if (!text)
        text = get_str(choice, "text");
    if (text && text[0]) {
        rc = buf_puts(&s->content, text);
        if (rc)
            return rc;
    }
    fin = get_str(choice, "finish_reason");
    if (fin && fin[0])
        copy_str(s->finish_reason, sizeof(s->finish_reason), fin);
    return 0;
}

/* The SDK tests "[DONE]" as a prefix; we also allow leading spaces, which a
 * parser that does not strip "data: " leaves behind. */
static int is_done(const char *data, size_t len)
{
    while (len > 0 && is_space(*data)) {
        data++;
        len--;
    }
    return len >= 6 && memcmp(data, "[DONE]", 6) == 0;
}

int openai_stream_feed(struct openai_stream *s, const char *data, size_t len,
                       const char **delta, size_t *delta_len, struct cr_err *err)
{
    size_t start = s->content.len;
    const cJSON *choices, *c;
    cJSON *root;
    int rc = 0;

    if (delta)
        *delta = s->content.data ? s->content.data + start : "";
    if (delta_len)
        *delta_len = 0;
    s->chunks++;
    if (is_done(data, len)) {
        s->done = 1;
        return 0;
    }
    /* An empty payload ("data:" alone) carries nothing; proxies use it as a
     * keepalive, so it is not worth failing the stream over. */
    if (is_blank(data, len))
        return 0;
    root = parse_object(data, len, "stream chunk", err);
    if (!root)
        return CR_EPROTO;
    if (is_error_payload(root)) {
        set_error(s, root, data, len);
        cJSON_Delete(root);
        return 0;
    }
    apply_model(s, root);
    apply_usage(s, root);
    choices = get(root, "choices");
    c = cJSON_IsArray(choices) ? choice0(choices) : NULL;
    if (c)
        rc = apply_choice(s, c, "delta");
    cJSON_Delete(root);
    if (rc)
        return cr_err_set(err, rc, "cannot append delta to content: %s", cr_strerror(rc));
    if (delta)
        *delta = s->content.data ? s->content.data + start : "";
    if (delta_len)
        *delta_len = s->content.len - start;
    return 0;
}

int openai_stream_complete(const struct openai_stream *s)
{
    if (s->error)
        return 0;
    return s->finish_reason[0] != '\0' || (s->done && s->content.len > 0);
}

int openai_chat_parse(struct openai_stream *s, const char *body, size_t len,
                      struct cr_err *err)
{
    const cJSON *choices, *c;
    cJSON *root;
    int rc = 0;

    root = parse_object(body, len, "chat response", err);
    if (!root)
        return CR_EPROTO;
    s->chunks++;
    if (is_error_payload(root)) {
        set_error(s, root, body, len);
        cJSON_Delete(root);
        return 0;
    }
    choices = get(root, "choices");
    if (!cJSON_IsArray(choices)) {
        cJSON_Delete(root);
        return cr_err_set(err, CR_EPROTO, "chat response has no 'choices' array");
    }
    apply_model(s, root);
    apply_usage(s, root);
    c = choice0(choices);
    if (c)
        rc = apply_choice(s, c, "message");
    cJSON_Delete(root);
    if (rc)
        return cr_err_set(err, rc, "cannot store chat response content");
    return 0;
}

/* ------------------------------------------------------------- embeddings */

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || c == '-')
        return 62;
    if (c == '/' || c == '_')
        return 63;
    return -1;
}

/* Decodes standard or URL-safe base64, padding optional. out must hold
 * n / 4 * 3 + 2 bytes. Returns the decoded length, or -1 on a bad character
 * or an impossible length. */
static long b64_decode(const char *s, size_t n, unsigned char *out)
{
    uint32_t acc = 0;
    size_t i, bits = 0;
    long o = 0;

    while (n > 0 && s[n - 1] == '=')
        n--;
    if (n % 4 == 1)
        return -1;
    for (i = 0; i < n; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (v < 0)
            return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    return o;
}

/* Returns a new array of numbers from base64 little-endian float32s, or NULL
 * with *rc set. */
static cJSON *b64_vector(const char *s, int *rc)
{
    size_t n = strlen(s), i, count;
    unsigned char *bytes;
    float *vals;
    cJSON *arr = NULL;
    long got;

    bytes = cr_malloc(n / 4 * 3 + 2);
    if (!bytes) {
        *rc = CR_ENOMEM;
        return NULL;
    }
    got = b64_decode(s, n, bytes);
    if (got < 0 || got % 4 != 0 || (size_t)got / 4 > INT_MAX) {
        cr_free(bytes);
        *rc = CR_EPROTO;
        return NULL;
    }
    count = (size_t)got / 4;
    vals = cr_malloc(count * sizeof(*vals));
    if (!vals) {
        cr_free(bytes);
        *rc = CR_ENOMEM;
        return NULL;
    }
    /* Assemble each word byte by byte so the host's endianness does not matter. */
    for (i = 0; i < count; i++) {
        const unsigned char *b = bytes + 4 * i;
        uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                     (uint32_t)b[3] << 24;
        memcpy(&vals[i], &u, sizeof(u));
    }
    arr = cJSON_CreateFloatArray(vals, (int)count);
    if (!arr)
        *rc = CR_ENOMEM;
    cr_free(vals);
    cr_free(bytes);
    return arr;
}

/* Takes the "embedding" of one data item out of the parsed tree (float array,
 * detached without copying) or decodes it (base64). Returns it, or NULL with
 * *rc set. */
static cJSON *take_vector(cJSON *item, int *rc)
{
    cJSON *emb = cJSON_GetObjectItemCaseSensitive(item, "embedding");
    const cJSON *x;

    if (cJSON_IsString(emb))
        return b64_vector(emb->valuestring, rc);
    if (!cJSON_IsArray(emb)) {
        *rc = CR_EPROTO;
        return NULL;
    }
    cJSON_ArrayForEach(x, emb)
    {
        if (!cJSON_IsNumber(x)) {
            *rc = CR_EPROTO;
            return NULL;
        }
    }
    return cJSON_DetachItemViaPointer(item, emb);
}

cJSON *openai_embed_parse(const char *body, size_t len, int list_input,
                          long *prompt_tokens, struct cr_err *err)
{
    cJSON *root, *data, *item, *out = NULL, **slots = NULL;
    int n = 0, pos = 0, i, rc = 0;

    if (prompt_tokens)
        *prompt_tokens = -1;
    root = parse_object(body, len, "embeddings response", err);
    if (!root)
        return NULL;
    if (is_error_payload(root)) {
        struct openai_error e;
        memset(&e, 0, sizeof(e));
        if (!json_error(root, &e))
            copy_str(e.message, sizeof(e.message), "unknown error");
        cr_err_set(err, CR_EPROTO, "embeddings error: %s", e.message);
        goto done;
    }
    data = cJSON_GetObjectItemCaseSensitive(root, "data");
    if (!cJSON_IsArray(data)) {
        cr_err_set(err, CR_EPROTO, "embeddings response has no 'data' array");
        goto done;
    }
    n = cJSON_GetArraySize(data);
    if (!list_input && n < 1) {
        cr_err_set(err, CR_EPROTO, "embeddings response has no vector");
        goto done;
    }
    slots = cr_calloc((size_t)(n ? n : 1), sizeof(*slots));
    if (!slots) {
        cr_err_set(err, CR_ENOMEM, "cannot allocate %d embeddings", n);
        goto done;
    }
    cJSON_ArrayForEach(item, data)
    {
        const cJSON *idx = cJSON_GetObjectItemCaseSensitive(item, "index");
        int k = pos++;
        if (!cJSON_IsObject(item)) {
            cr_err_set(err, CR_EPROTO, "embedding %d is not an object", k);
            goto done;
        }
        /* Indexes must be a permutation of 0..n-1; with n items and no
         * duplicates every slot is then filled. */
        if (idx) {
            double d = cJSON_IsNumber(idx) ? idx->valuedouble : -1;
            if (!(d >= 0 && d < n && d == (double)(int)d)) {
                cr_err_set(err, CR_EPROTO, "embedding %d has a bad 'index'", k);
                goto done;
            }
            k = (int)d;
        }
        if (slots[k]) {
            cr_err_set(err, CR_EPROTO, "embedding index %d appears twice", k);
            goto done;
        }
        slots[k] = take_vector(item, &rc);
        if (!slots[k]) {
            if (rc == CR_ENOMEM)
                cr_err_set(err, rc, "cannot allocate embedding %d", k);
            else
                cr_err_set(err, rc, "embedding %d is not a float array or base64", k);
            goto done;
        }
    }
    if (list_input) {
        out = cJSON_CreateArray();
        if (!out) {
            cr_err_set(err, CR_ENOMEM, "cannot allocate embeddings list");
            goto done;
        }
        for (i = 0; i < n; i++) {
            cJSON_AddItemToArray(out, slots[i]);
            slots[i] = NULL;
        }
    } else {
        /* A single input may still come back with extra items from a lax
         * server; the one at index 0 is the answer. */
        out = slots[0];
        slots[0] = NULL;
    }
    if (prompt_tokens)
        *prompt_tokens =
            get_count(cJSON_GetObjectItemCaseSensitive(root, "usage"), "prompt_tokens");
done:
    if (slots) {
        for (i = 0; i < n; i++)
            cJSON_Delete(slots[i]);
        cr_free(slots);
    }
    cJSON_Delete(root);
    return out;
}
