/* openai.c -- OpenAI-compatible response mapping (chunks, bodies, errors). */
#include "openai.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../util/alloc.h"
#include "../util/base64.h"
#include "pyjson.h"

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

/* How many of src's n bytes fit in cap bytes with a NUL: at most cap-1, cut
 * before a UTF-8 continuation byte so a truncated text never ends in half a
 * character. */
static size_t cut_len(const char *src, size_t n, size_t cap)
{
    if (n >= cap) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
            n--;
    }
    return n;
}

/* Copies at most cap-1 bytes (see cut_len()) and NUL-terminates. */
static void copy_text(char *dst, size_t cap, const char *src, size_t n)
{
    n = cut_len(src, n, cap);
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

/* ------------------------------------------------------------- surrogates */

/* A server that cuts its text into UTF-16 code units may send half a pair
 * per chunk: "\ud83d" at the end of one, "\ude00" at the start of the next.
 * cJSON refuses such a lone surrogate escape, so a payload holding one is
 * parsed from a copy in which each lone surrogate is written as its 3-byte
 * generalized UTF-8 form (ED A0..BF xx, "WTF-8"), which cJSON passes through
 * as bytes. settle_text() then joins or replaces those in the content. */

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    int i;

    for (i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static int is_high(unsigned u)
{
    return u >= 0xD800 && u <= 0xDBFF;
}

static int is_low(unsigned u)
{
    return u >= 0xDC00 && u <= 0xDFFF;
}

/* Whether the \u escape at p (n bytes left, p[0] == '\\', p[1] == 'u') is
 * a lone surrogate; *skip gets the bytes the escape (or pair) spans. */
static int lone_escape(const char *p, size_t n, size_t *skip)
{
    unsigned u, lo;

    *skip = 2;
    if (n < 6 || hex4(p + 2, &u))
        return 0;
    *skip = 6;
    if (is_low(u))
        return 1;
    if (!is_high(u))
        return 0;
    if (n >= 12 && p[6] == '\\' && p[7] == 'u' && hex4(p + 8, &lo) == 0 && is_low(lo)) {
        *skip = 12;
        return 0;
    }
    return 1;
}

/* Returns a new copy of the n bytes at txt with every lone surrogate escape
 * (inside a string) written as WTF-8, NULL when there is none (or no memory:
 * the payload then fails to parse as before). *out_len gets its length. */
static char *rewrite_lone(const char *txt, size_t n, size_t *out_len)
{
    size_t i = 0, o = 0, skip;
    int in_str = 0, found = 0;
    char *copy = NULL;

    /* Two passes of one loop: find, then (with copy) write. */
    for (;;) {
        for (i = 0, in_str = 0; i < n;) {
            char c = txt[i];
            if (!in_str) {
                in_str = c == '"';
            } else if (c == '"') {
                in_str = 0;
            } else if (c == '\\' && i + 1 < n) {
                if (txt[i + 1] == 'u' && lone_escape(txt + i, n - i, &skip)) {
                    unsigned u;
                    hex4(txt + i + 2, &u);
                    found = 1;
                    if (copy) {
                        copy[o++] = (char)0xED;
                        copy[o++] = (char)(0x80 | ((u >> 6) & 0x3F));
                        copy[o++] = (char)(0x80 | (u & 0x3F));
                    }
                    i += 6;
                    continue;
                }
                skip = txt[i + 1] == 'u' ? skip : 2;
                if (copy)
                    memcpy(copy + o, txt + i, skip <= n - i ? skip : n - i);
                o += skip <= n - i ? skip : n - i;
                i += skip;
                continue;
            }
            if (copy)
                copy[o] = c;
            o++;
            i++;
        }
        if (copy || !found)
            break;
        copy = cr_malloc(n + 1);
        if (!copy)
            return NULL;
        o = 0;
    }
    if (copy) {
        copy[o] = '\0';
        *out_len = o;
    }
    return copy;
}

/* parse_object(), lone surrogates allowed (see rewrite_lone()). */
static cJSON *parse_lenient(const char *txt, size_t len, const char *what,
                            struct cr_err *err)
{
    size_t n = 0;
    char *copy = memmem(txt, len, "\\u", 2) ? rewrite_lone(txt, len, &n) : NULL;
    cJSON *root;

    if (!copy)
        return parse_object(txt, len, what, err);
    root = parse_object(copy, n, what, err);
    cr_free(copy);
    return root;
}

/* The UTF-16 code unit of the WTF-8 surrogate at p (n bytes left), or 0. */
static unsigned wtf8_unit(const char *p, size_t n)
{
    const unsigned char *u = (const unsigned char *)p;

    if (n < 3 || u[0] != 0xED || u[1] < 0xA0 || u[1] > 0xBF || (u[2] & 0xC0) != 0x80)
        return 0;
    return 0xD000u | (unsigned)(u[1] & 0x3F) << 6 | (unsigned)(u[2] & 0x3F);
}

static void put_utf8_astral(char *o, unsigned hi, unsigned lo)
{
    unsigned cp = 0x10000u + ((hi - 0xD800u) << 10) + (lo - 0xDC00u);

    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
}

static const char replacement[3] = {'\xEF', '\xBF', '\xBD'}; /* U+FFFD */

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
    const char *msg = NULL, *top = get_str(root, "message");

    if (cJSON_IsObject(e)) {
        scalar_text(out->type, sizeof(out->type), get(e, "type"));
        scalar_text(out->code, sizeof(out->code), get(e, "code"));
        scalar_text(out->param, sizeof(out->param), get(e, "param"));
        msg = get_str(e, "message");
    } else if (cJSON_IsString(e) && e->valuestring[0]) {
        msg = e->valuestring;
        /* {"error":"Unauthorized","message":"key revoked"}: the string is a
         * title and the message says why; both are kept. */
        if (top && top[0] && strcmp(top, msg) != 0) {
            char both[2 * sizeof(out->message)];
            snprintf(both, sizeof(both), "%.*s: %s", (int)sizeof(out->message), msg, top);
            copy_str(out->message, sizeof(out->message), both);
            msg = NULL;
            top = NULL;
        }
    }
    if (!msg && out->message[0]) {
        if (!out->type[0])
            scalar_text(out->type, sizeof(out->type), get(root, "type"));
        if (!out->code[0])
            scalar_text(out->code, sizeof(out->code), get(root, "code"));
        return 1;
    }
    if (!msg)
        msg = top;
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

/* Bytes kept of a model name and of each error detail, NUL included. */
#define MODEL_MAX 128
#define ERROR_TYPE_MAX 64
#define ERROR_CODE_MAX 64
#define ERROR_MESSAGE_MAX 512

/* Every string of a stream is either `none` or a heap copy it owns. */
static const char none[] = "";

static void free_str(const char *p)
{
    if (p != none)
        cr_free((char *)p);
}

void openai_stream_init(struct openai_stream *s)
{
    memset(s, 0, sizeof(*s));
    buf_init(&s->content);
    s->model = s->error_type = s->error_code = s->error_message = none;
    s->prompt_tokens = -1;
    s->completion_tokens = -1;
    s->total_tokens = -1;
    s->cached_tokens = -1;
    s->reasoning_tokens = -1;
}

/* The three error strings share one block, which error_type points at. */
static void free_error(struct openai_stream *s)
{
    free_str(s->error_type);
    s->error_type = s->error_code = s->error_message = none;
}

void openai_stream_release(struct openai_stream *s)
{
    buf_release(&s->content);
    free_str(s->model);
    s->model = none;
    free_error(s);
}

int openai_stream_set_error(struct openai_stream *s, const char *type, const char *code,
                            const char *message)
{
    size_t tn, cn, mn;
    char *block;

    type = type ? type : "";
    code = code ? code : "";
    message = message ? message : "";
    tn = cut_len(type, strlen(type), ERROR_TYPE_MAX);
    cn = cut_len(code, strlen(code), ERROR_CODE_MAX);
    mn = cut_len(message, strlen(message), ERROR_MESSAGE_MAX);
    s->error = 1;
    free_error(s);
    block = cr_malloc(tn + cn + mn + 3);
    if (!block)
        return CR_ENOMEM;
    copy_text(block, tn + 1, type, tn);
    copy_text(block + tn + 1, cn + 1, code, cn);
    copy_text(block + tn + cn + 2, mn + 1, message, mn);
    s->error_type = block;
    s->error_code = block + tn + 1;
    s->error_message = block + tn + cn + 2;
    return 0;
}

static int set_error(struct openai_stream *s, const cJSON *root, const char *data,
                     size_t len, struct cr_err *err)
{
    struct openai_error e;
    int rc;

    memset(&e, 0, sizeof(e));
    if (!json_error(root, &e))
        raw_error(data, len, &e);
    rc = openai_stream_set_error(s, e.type, e.code, e.message);
    if (rc)
        return cr_err_set(err, rc, "cannot store error details");
    return 0;
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
    /* OpenAI's details: prompt_tokens_details.cached_tokens (billed at the
     * cached rate) and completion_tokens_details.reasoning_tokens. */
    s->cached_tokens = get_count(get(u, "prompt_tokens_details"), "cached_tokens");
    s->reasoning_tokens =
        get_count(get(u, "completion_tokens_details"), "reasoning_tokens");
    if (s->total_tokens < 0 && s->prompt_tokens >= 0 && s->completion_tokens >= 0)
        s->total_tokens = s->prompt_tokens + s->completion_tokens;
}

/* Records the model name m (n bytes, no NUL among them). Azure's filter-only
 * chunk carries "model":"" and must not blank it. */
static int set_model(struct openai_stream *s, const char *m, size_t n, struct cr_err *err)
{
    char *copy;

    if (n == 0)
        return 0;
    n = cut_len(m, n, MODEL_MAX);
    /* Every chunk repeats the name: only a change costs an allocation. */
    if (strncmp(s->model, m, n) == 0 && s->model[n] == '\0')
        return 0;
    copy = cr_strndup(m, n);
    if (!copy)
        return cr_err_set(err, CR_ENOMEM, "cannot store model name");
    free_str(s->model);
    s->model = copy;
    return 0;
}

static int apply_model(struct openai_stream *s, const cJSON *root, struct cr_err *err)
{
    const char *m = get_str(root, "model");
    return m ? set_model(s, m, strlen(m), err) : 0;
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

/* One chunk through cJSON: any shape. */
static int feed_json(struct openai_stream *s, const char *data, size_t len,
                     struct cr_err *err)
{
    const cJSON *choices, *c;
    cJSON *root;
    int rc;

    root = parse_lenient(data, len, "stream chunk", err);
    if (!root)
        return CR_EPROTO;
    if (is_error_payload(root)) {
        rc = set_error(s, root, data, len, err);
        cJSON_Delete(root);
        return rc;
    }
    rc = apply_model(s, root, err);
    if (rc) {
        cJSON_Delete(root);
        return rc;
    }
    apply_usage(s, root);
    choices = get(root, "choices");
    c = cJSON_IsArray(choices) ? choice0(choices) : NULL;
    if (c)
        rc = apply_choice(s, c, "delta");
    cJSON_Delete(root);
    if (rc)
        return cr_err_set(err, rc, "cannot append delta to content: %s", cr_strerror(rc));
    return 0;
}

/* ------------------------------------------------------ chunk fast path */

/* Nearly every payload of a stream is one text delta:
 *   {"id":"..","object":"chat.completion.chunk","created":1,"model":"..",
 *    "choices":[{"index":0,"delta":{"content":".."},"finish_reason":null}]}
 * Building and freeing a cJSON tree for it was most of the worker's CPU per
 * streamed token, so this scanner reads that shape (and the legacy
 * {"choices":[{"text":".."}]}) in place. It gives up, and the payload goes
 * through feed_json(), on anything else: errors, usage objects, tool calls or
 * any other key in "delta", nested values, several choices, a non-zero
 * "index", escapes in keys, the model or finish_reason, and all that strict
 * JSON refuses (see pyjson.h: control characters or invalid UTF-8 in strings,
 * other whitespace, \u0000, numbers over 63 bytes). What it accepts, cJSON parses too
 * and the result is byte for byte the same; the "fastpath" test and
 * tests/fuzz/fuzz_sse.c hold the two paths to that. A key that feed_json()
 * starts to read must be taught here as well (or made to give up). */

/* What the cJSON path would read from a chunk; the strings are borrowed from
 * the payload (p is NULL when absent or not a string). */
struct chunk {
    struct py_json_str model, content, text, finish;
};

/* The payload is read with pyjson's strict scanner, which accepts a subset of
 * what cJSON accepts: whatever it refuses (raw control characters or invalid
 * UTF-8 in a string, say) simply gives up to cJSON. */
struct scanner {
    struct py_json_scan js;
    struct chunk *c;
    unsigned seen; /* known keys met in the current object (duplicates give up) */
};

#define KEY_MODEL 0x01u
#define KEY_CHOICES 0x02u
#define KEY_INDEX 0x04u
#define KEY_DELTA 0x08u
#define KEY_TEXT 0x10u
#define KEY_FINISH 0x20u
#define KEY_CONTENT 0x40u

static int peek(const struct py_json_scan *js)
{
    return js->pos < js->len ? (unsigned char)js->s[js->pos] : -1;
}

/* Scans a string, number, true, false or null; *s gets the string, if any.
 * Objects, arrays, NaN and Infinity give up. */
static int scan_scalar(struct py_json_scan *js, struct py_json_str *s)
{
    struct py_json_str ignored;

    switch (peek(js)) {
    case -1:
        return -1;
    case '"':
        return py_json_scan_string(js, s ? s : &ignored);
    case 't':
        return py_json_scan_literal(js, "true");
    case 'f':
        return py_json_scan_literal(js, "false");
    case 'n':
        return py_json_scan_literal(js, "null");
    default:
        return py_json_scan_number(js);
    }
}

static int key_is(const struct py_json_str *key, const char *name)
{
    return key->raw == strlen(name) && memcmp(key->p, name, key->raw) == 0;
}

/* Marks a known key as met; a second one gives up, because cJSON reads the
 * first and which one wins is not worth copying. */
static int first_time(struct scanner *sc, unsigned key)
{
    if (sc->seen & key)
        return -1;
    sc->seen |= key;
    return 0;
}

/* Scans the object at the scanner's position, handing each key to member(),
 * which scans its value. Keys with escapes give up. */
static int scan_object(struct scanner *sc, py_json_member_fn *member)
{
    unsigned outer = sc->seen;
    int rc;

    sc->seen = 0;
    rc = py_json_scan_object(&sc->js, member, sc);
    sc->seen = outer;
    return rc;
}

/* In "delta" only "content" and "role" are known; anything else there
 * (tool_calls, reasoning, refusal) may one day matter, so it gives up. */
static int delta_member(struct py_json_scan *js, const struct py_json_str *key,
                        void *privdata)
{
    struct scanner *sc = privdata;
    struct py_json_str v = {NULL, 0, 0};

    if (key->raw != key->len)
        return -1;
    if (key_is(key, "content")) {
        if (first_time(sc, KEY_CONTENT) || scan_scalar(js, &v))
            return -1;
        sc->c->content = v;
        return 0;
    }
    if (key_is(key, "role"))
        return scan_scalar(js, NULL);
    return -1;
}

static int choice_member(struct py_json_scan *js, const struct py_json_str *key,
                         void *privdata)
{
    struct scanner *sc = privdata;
    struct py_json_str v = {NULL, 0, 0};

    if (key->raw != key->len)
        return -1;
    if (key_is(key, "index")) {
        /* Only a plain 0 is sure to equal 0 the way cJSON reads it ("01" or
         * "0.5" fail at the next byte, which must be , or } after a value). */
        return first_time(sc, KEY_INDEX) || py_json_scan_literal(js, "0") ? -1 : 0;
    }
    if (key_is(key, "delta")) {
        if (first_time(sc, KEY_DELTA))
            return -1;
        /* Not an object: no content, as in apply_choice(). */
        if (peek(js) == '{')
            return scan_object(sc, delta_member);
        return scan_scalar(js, NULL);
    }
    if (key_is(key, "text")) {
        if (first_time(sc, KEY_TEXT) || scan_scalar(js, &v))
            return -1;
        sc->c->text = v;
        return 0;
    }
    if (key_is(key, "finish_reason")) {
        if (first_time(sc, KEY_FINISH) || scan_scalar(js, &v) || v.raw != v.len)
            return -1;
        sc->c->finish = v;
        return 0;
    }
    return scan_scalar(js, NULL);
}

/* Zero or one choice, an object. */
static int choice_element(struct py_json_scan *js, size_t index, void *privdata)
{
    if (index > 0 || peek(js) != '{')
        return -1;
    return scan_object(privdata, choice_member);
}

static int top_member(struct py_json_scan *js, const struct py_json_str *key,
                      void *privdata)
{
    struct scanner *sc = privdata;
    struct py_json_str v = {NULL, 0, 0};

    if (key->raw != key->len)
        return -1;
    if (key_is(key, "model")) {
        if (first_time(sc, KEY_MODEL) || scan_scalar(js, &v) || v.raw != v.len)
            return -1;
        sc->c->model = v;
        return 0;
    }
    if (key_is(key, "choices")) {
        if (first_time(sc, KEY_CHOICES) || peek(js) != '[')
            return -1;
        return py_json_scan_array(js, choice_element, sc);
    }
    /* Error payloads are left to cJSON whatever their shape. */
    if (key_is(key, "error") || key_is(key, "type"))
        return -1;
    if (key_is(key, "object")) {
        if (scan_scalar(js, &v) || v.raw != v.len ||
            (v.p && v.raw == 5 && memcmp(v.p, "error", 5) == 0))
            return -1;
        return 0;
    }
    /* Other keys, "usage":null among them, are read by nobody. */
    return scan_scalar(js, NULL);
}

/* Scans a whole payload into *c. Returns 0, or -1 to leave it to cJSON. */
static int scan_chunk(const char *data, size_t len, struct chunk *c)
{
    struct scanner sc;

    memset(c, 0, sizeof(*c));
    py_json_scan_init(&sc.js, data, len);
    sc.c = c;
    sc.seen = 0;
    py_json_skip_ws(&sc.js);
    if (peek(&sc.js) != '{' || scan_object(&sc, top_member))
        return -1;
    py_json_skip_ws(&sc.js);
    return sc.js.pos == len ? 0 : -1;
}

/* feed_json() for a chunk scan_chunk() read, in the same order. */
static int feed_scanned(struct openai_stream *s, const struct chunk *c,
                        struct cr_err *err)
{
    const struct py_json_str *t = c->content.p ? &c->content : &c->text;
    int rc;

    if (c->model.p) {
        rc = set_model(s, c->model.p, c->model.len, err);
        if (rc)
            return rc;
    }
    if (t->p && t->len > 0) {
        rc = buf_reserve(&s->content, t->len);
        if (rc)
            return cr_err_set(err, rc, "cannot append delta to content: %s",
                              cr_strerror(rc));
        py_json_unescape(t, s->content.data + s->content.len);
        s->content.len += t->len;
        s->content.data[s->content.len] = '\0';
    }
    if (c->finish.p && c->finish.len > 0)
        copy_text(s->finish_reason, sizeof(s->finish_reason), c->finish.p, c->finish.len);
    return 0;
}

int openai__fast_path(const char *data, size_t len)
{
    struct chunk c;
    return !is_done(data, len) && !is_blank(data, len) && scan_chunk(data, len, &c) == 0;
}

/* ------------------------------------------------------ surrogate joining */

/* Inserts the n bytes p at content offset at. */
static int insert_at(struct buf *b, size_t at, const char *p, size_t n)
{
    int rc = buf_reserve(b, n);

    if (rc)
        return rc;
    memmove(b->data + at + n, b->data + at, b->len - at);
    memcpy(b->data + at, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

/* Settles the surrogates of the text appended to content at start (see
 * openai_stream_feed()): first the one held from the last delta, then the
 * WTF-8 ones rewrite_lone() let in, compacted in place (a pair's 6 bytes
 * become 4, a lone one's 3 become U+FFFD's 3, or 0 when held). Linear in the
 * new text. ending: nothing more will come. */
static int settle_text(struct openai_stream *s, size_t start, int ending)
{
    struct buf *b = &s->content;
    size_t r, w, n;
    unsigned u, lo;
    int rc;

    if (s->held_surrogate) {
        lo = b->len > start ? wtf8_unit(b->data + start, b->len - start) : 0;
        if (is_low(lo)) {
            if ((rc = buf_reserve(b, 1)))
                return rc;
            memmove(b->data + start + 4, b->data + start + 3, b->len - start - 3);
            put_utf8_astral(b->data + start, s->held_surrogate, lo);
            b->len += 1;
            b->data[b->len] = '\0';
            start += 4;
        } else if (b->len > start || ending) {
            if ((rc = insert_at(b, start, replacement, sizeof(replacement))))
                return rc;
            start += sizeof(replacement);
        } else {
            return 0; /* an empty delta: keep holding */
        }
        s->held_surrogate = 0;
    }
    if (b->len <= start || !memchr(b->data + start, 0xED, b->len - start))
        return 0;
    for (r = w = start; r < b->len;) {
        n = b->len - r;
        u = wtf8_unit(b->data + r, n);
        if (!u) {
            b->data[w++] = b->data[r++];
            continue;
        }
        lo = is_high(u) && n >= 6 ? wtf8_unit(b->data + r + 3, n - 3) : 0;
        if (is_low(lo)) {
            put_utf8_astral(b->data + w, u, lo);
            w += 4;
            r += 6;
        } else if (is_high(u) && n == 3 && !ending) {
            s->held_surrogate = u;
            r += 3;
        } else {
            memcpy(b->data + w, replacement, sizeof(replacement));
            w += 3;
            r += 3;
        }
    }
    b->len = w;
    b->data[w] = '\0';
    return 0;
}

int openai_stream_end(struct openai_stream *s, const char **delta, size_t *delta_len)
{
    size_t start = s->content.len;
    int rc = settle_text(s, start, 1);

    if (delta)
        *delta = s->content.data ? s->content.data + start : "";
    if (delta_len)
        *delta_len = s->content.len - start;
    return rc;
}

/* ------------------------------------------------------------ error status */

long openai_error_status(const char *type, const char *code)
{
    static const struct {
        const char *name;
        long status;
    } names[] = {
        {"invalid_api_key", 401},
        {"invalid_authentication", 401},
        {"authentication_error", 401},
        {"AuthenticationError", 401},
        {"insufficient_quota", 429},
        {"billing_error", 402},
        {"permission_error", 403},
        {"PermissionDeniedError", 403},
        {"not_found_error", 404},
        {"model_not_found", 404},
        {"NotFoundError", 404},
        {"invalid_request_error", 400},
        {"invalid_request", 400},
        {"bad_request", 400},
        {"BadRequestError", 400},
        {"context_length_exceeded", 400},
        {"content_filter", 400},
        {"request_too_large", 413},
        {"rate_limit_exceeded", 429},
        {"rate_limit_error", 429},
        {"RateLimitError", 429},
        {"tokens", 429},
        {"requests", 429},
        {"overloaded_error", 529},
        {"overloaded", 529},
        {"server_overloaded", 529},
        {"unavailable_error", 503},
        {"server_error", 500},
        {"api_error", 500},
        {"internal_error", 500},
        {"InternalServerError", 500},
        {"timeout", 504},
        {"timeout_error", 504},
    };
    const char *keys[2] = {code, type};
    size_t i, k;
    long n = 0;

    for (k = 0; k < 2; k++) {
        const char *c = keys[k];
        if (!c || !c[0])
            continue;
        for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
            if (strcmp(c, names[i].name) == 0)
                return names[i].status;
        /* vLLM and llama.cpp put the HTTP status in "code". */
        for (n = 0, i = 0; c[i] >= '0' && c[i] <= '9' && i < 4; i++)
            n = n * 10 + (c[i] - '0');
        if (c[i] == '\0' && n >= 400 && n <= 599)
            return n;
    }
    return 0;
}

/* ---------------------------------------------------------------- feeding */

static int feed(struct openai_stream *s, const char *data, size_t len, const char **delta,
                size_t *delta_len, struct cr_err *err, int fast)
{
    size_t start = s->content.len;
    struct chunk c;
    int rc;

    if (delta)
        *delta = s->content.data ? s->content.data + start : "";
    if (delta_len)
        *delta_len = 0;
    s->chunks++;
    if (is_done(data, len)) {
        s->done = 1;
        rc = settle_text(s, start, 1);
        if (rc)
            return cr_err_set(err, rc, "cannot append delta to content: %s",
                              cr_strerror(rc));
        if (delta_len)
            *delta_len = s->content.len - start;
        if (delta)
            *delta = s->content.data ? s->content.data + start : "";
        return 0;
    }
    /* An empty payload ("data:" alone) carries nothing; proxies use it as a
     * keepalive, so it is not worth failing the stream over. */
    if (is_blank(data, len))
        return 0;
    if (fast && scan_chunk(data, len, &c) == 0)
        rc = feed_scanned(s, &c, err);
    else
        rc = feed_json(s, data, len, err);
    if (rc)
        return rc;
    if (s->content.len > start || s->held_surrogate) {
        rc = settle_text(s, start, s->finish_reason[0] != '\0');
        if (rc)
            return cr_err_set(err, rc, "cannot append delta to content: %s",
                              cr_strerror(rc));
    }
    if (s->content.len > start)
        s->content_chunks++;
    if (delta)
        *delta = s->content.data ? s->content.data + start : "";
    if (delta_len)
        *delta_len = s->content.len - start;
    return 0;
}

int openai_stream_feed(struct openai_stream *s, const char *data, size_t len,
                       const char **delta, size_t *delta_len, struct cr_err *err)
{
    return feed(s, data, len, delta, delta_len, err, 1);
}

int openai__stream_feed_json(struct openai_stream *s, const char *data, size_t len,
                             const char **delta, size_t *delta_len, struct cr_err *err)
{
    return feed(s, data, len, delta, delta_len, err, 0);
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

    root = parse_lenient(body, len, "chat response", err);
    if (!root)
        return CR_EPROTO;
    s->chunks++;
    if (is_error_payload(root)) {
        rc = set_error(s, root, body, len, err);
        cJSON_Delete(root);
        return rc;
    }
    choices = get(root, "choices");
    if (!cJSON_IsArray(choices)) {
        cJSON_Delete(root);
        return cr_err_set(err, CR_EPROTO, "chat response has no 'choices' array");
    }
    rc = apply_model(s, root, err);
    if (rc) {
        cJSON_Delete(root);
        return rc;
    }
    apply_usage(s, root);
    c = choice0(choices);
    if (c)
        rc = apply_choice(s, c, "message");
    cJSON_Delete(root);
    if (!rc)
        rc = settle_text(s, 0, 1);
    if (rc)
        return cr_err_set(err, rc, "cannot store chat response content");
    if (s->content.len)
        s->content_chunks++;
    return 0;
}

/* ------------------------------------------------------------- embeddings */

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
    got = base64_decode(s, n, bytes, 0);
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
