/* chat_reply.c -- the provider-neutral chat answer accumulator. */
#include "chat_reply.h"

#include <string.h>

#include "../util/alloc.h"

#define MODEL_MAX 128
#define QUOTE_BYTES 60

static const char none[] = "";

static const char *const kind_names[] = {
#define CHAT__X(name, text) text,
    CHAT_ERROR_KIND_MAP(CHAT__X)
#undef CHAT__X
};

const char *chat_error_kind_name(enum chat_error_kind k)
{
    if ((unsigned)k >= sizeof(kind_names) / sizeof(kind_names[0]))
        return "unknown";
    return kind_names[k];
}

enum chat_error_kind chat_error_kind_of_status(long status)
{
    switch (status) {
    case 400:
    case 422:
        return CHAT_ERROR_BAD_REQUEST;
    case 401:
        return CHAT_ERROR_AUTH;
    case 402:
        return CHAT_ERROR_BILLING;
    case 403:
        return CHAT_ERROR_PERMISSION;
    case 404:
        return CHAT_ERROR_NOT_FOUND;
    case 408:
    case 504:
        return CHAT_ERROR_TIMEOUT;
    case 413:
        return CHAT_ERROR_TOO_LARGE;
    case 429:
        return CHAT_ERROR_RATE_LIMIT;
    case 503:
    case 529:
        return CHAT_ERROR_OVERLOADED;
    default:
        return status >= 500 && status <= 599 ? CHAT_ERROR_SERVER : CHAT_ERROR_UNKNOWN;
    }
}

void chat_copy_text(char *dst, size_t cap, const char *s, size_t n)
{
    if (cap == 0)
        return;
    if (!s)
        n = 0;
    if (n >= cap) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
            n--;
    }
    if (n)
        memcpy(dst, s, n);
    dst[n] = '\0';
}

void chat_reply_init(struct chat_reply *r)
{
    memset(r, 0, sizeof(*r));
    buf_init(&r->content);
    r->model = none;
    r->prompt_tokens = r->completion_tokens = r->total_tokens = -1;
    r->cached_tokens = r->cache_write_tokens = r->reasoning_tokens = -1;
}

void chat_reply_release(struct chat_reply *r)
{
    size_t i;

    buf_release(&r->content);
    if (r->model != none)
        cr_free((char *)r->model);
    r->model = none;
    for (i = 0; i < r->ntools; i++) {
        cr_free(r->tools[i].id);
        cr_free(r->tools[i].name);
        buf_release(&r->tools[i].arguments);
    }
    cr_free(r->tools);
    r->tools = NULL;
    r->ntools = r->tools_cap = 0;
    cr_free(r->err);
    r->err = NULL;
}

int chat_reply_set_error(struct chat_reply *r, const struct chat_error *e)
{
    int had = r->error;

    r->error = 1;
    if (had && r->err)
        return 0;
    r->err = cr_malloc(sizeof(*r->err));
    if (!r->err)
        return CR_ENOMEM;
    *r->err = *e;
    r->err->type[sizeof(r->err->type) - 1] = '\0';
    r->err->code[sizeof(r->err->code) - 1] = '\0';
    r->err->message[sizeof(r->err->message) - 1] = '\0';
    return 0;
}

int chat_reply_set_model(struct chat_reply *r, const char *m, size_t n)
{
    char *copy;

    if (!m || n == 0)
        return 0;
    if (n >= MODEL_MAX) {
        n = MODEL_MAX - 1;
        while (n > 0 && ((unsigned char)m[n] & 0xC0) == 0x80)
            n--;
    }
    if (strncmp(r->model, m, n) == 0 && r->model[n] == '\0')
        return 0;
    copy = cr_strndup(m, n);
    if (!copy)
        return CR_ENOMEM;
    if (r->model != none)
        cr_free((char *)r->model);
    r->model = copy;
    return 0;
}

int chat_reply_add_text(struct chat_reply *r, const char *s, size_t n)
{
    if (n == 0)
        return 0;
    if (r->max_content_bytes &&
        (r->content.len + n > r->max_content_bytes || r->content.len + n < n))
        return CR_ETOOBIG;
    return buf_append(&r->content, s, n);
}

struct chat_tool_call *chat_reply_tool(struct chat_reply *r, int key, int create, int *rc)
{
    struct chat_tool_call *t;
    size_t i;

    *rc = 0;
    for (i = r->ntools; i > 0; i--)
        if (r->tools[i - 1].key == key)
            return &r->tools[i - 1];
    if (!create)
        return NULL;
    if (r->ntools >= CHAT_REPLY_MAX_TOOLS) {
        *rc = CR_ETOOBIG;
        return NULL;
    }
    if (r->ntools == r->tools_cap) {
        size_t cap = r->tools_cap ? r->tools_cap * 2 : 2;
        struct chat_tool_call *n = cr_realloc(r->tools, cap * sizeof(*n));
        if (!n) {
            *rc = CR_ENOMEM;
            return NULL;
        }
        r->tools = n;
        r->tools_cap = cap;
    }
    t = &r->tools[r->ntools];
    memset(t, 0, sizeof(*t));
    t->key = key;
    t->id = cr_strdup("");
    t->name = cr_strdup("");
    buf_init(&t->arguments);
    t->arguments.max_bytes = CHAT_REPLY_MAX_ARGS_BYTES;
    if (!t->id || !t->name) {
        cr_free(t->id);
        cr_free(t->name);
        *rc = CR_ENOMEM;
        return NULL;
    }
    r->ntools++;
    return t;
}

int chat_tool_set(char **field, const char *s)
{
    char *copy;

    if (!s || !s[0])
        return 0;
    if (*field && strcmp(*field, s) == 0)
        return 0;
    copy = cr_strndup(s, strnlen(s, 255));
    if (!copy)
        return CR_ENOMEM;
    cr_free(*field);
    *field = copy;
    return 0;
}

int chat_tool_add_args(struct chat_tool_call *t, const char *s, size_t n)
{
    return n ? buf_append(&t->arguments, s, n) : 0;
}

void chat_reply_sum_usage(struct chat_reply *r)
{
    if (r->prompt_tokens >= 0 && r->completion_tokens >= 0)
        r->total_tokens = r->prompt_tokens + r->completion_tokens;
}

long chat_json_count(const cJSON *item)
{
    double d;

    if (!cJSON_IsNumber(item))
        return -1;
    d = item->valuedouble;
    if (!(d >= 0))
        return -1;
    if (d > 1e15)
        d = 1e15;
    return (long)d;
}

cJSON *chat_reply_tool_calls_json(const struct chat_reply *r)
{
    cJSON *arr = cJSON_CreateArray(), *c, *f;
    size_t i;

    if (!arr)
        return NULL;
    for (i = 0; i < r->ntools; i++) {
        const struct chat_tool_call *t = &r->tools[i];
        c = cJSON_CreateObject();
        if (!c || !cJSON_AddItemToArray(arr, c))
            goto oom_c;
        f = NULL;
        if (!cJSON_AddStringToObject(c, "id", t->id) ||
            !cJSON_AddStringToObject(c, "type", "function") ||
            !(f = cJSON_AddObjectToObject(c, "function")) ||
            !cJSON_AddStringToObject(f, "name", t->name) ||
            !cJSON_AddStringToObject(f, "arguments",
                                     t->arguments.data ? t->arguments.data : ""))
            goto oom;
    }
    return arr;
oom_c:
    cJSON_Delete(c);
oom:
    cJSON_Delete(arr);
    return NULL;
}

int chat_json_blank(const char *s, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
            return 0;
    return 1;
}

int chat_store_error(int rc, struct cr_err *err, const char *what)
{
    if (rc == CR_ETOOBIG)
        return cr_err_set(err, rc, "%s is too large", what);
    return cr_err_set(err, rc, "cannot store %s", what);
}

void chat_reply_delta(const struct chat_reply *r, size_t start, const char **delta,
                      size_t *delta_len)
{
    if (delta)
        *delta = r->content.data ? r->content.data + start : "";
    if (delta_len)
        *delta_len = r->content.len - start;
}

int chat_reply_complete(const struct chat_reply *r)
{
    return r->done && !r->error;
}

cJSON *chat_json_parse(const char *s, size_t len, int object, const char *what,
                       struct cr_err *err)
{
    const char *end = NULL;
    cJSON *root = NULL;
    int q = (int)(len < QUOTE_BYTES ? len : QUOTE_BYTES);

    if (s && len > 0)
        root = cJSON_ParseWithLengthOpts(s, len, &end, 0);
    if (root && !chat_json_blank(end, len - (size_t)(end - s))) {
        cJSON_Delete(root);
        root = NULL;
    }
    if (!root) {
        cr_err_set(err, CR_EPROTO, "%s is not valid json: '%.*s'", what, q, s ? s : "");
        return NULL;
    }
    if (object && !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        cr_err_set(err, CR_EPROTO, "%s is not a json object: '%.*s'", what, q, s);
        return NULL;
    }
    return root;
}
