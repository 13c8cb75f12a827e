/* fake_fast.c -- fast fake OpenAI-compatible streaming server (C, libuv) for benchmarks.
 *
 *   build/bench/fake_fast [--port N] [--defaults 'k=v,k=v']
 *
 * Prints "PORT <n>" on stdout once listening on 127.0.0.1. One thread, one
 * loop, so that its CPU cost can be read from /proc and shown not to be the
 * bottleneck. It speaks just enough HTTP/1.1 for libcurl, requests and
 * urllib: Content-Length request bodies, keep-alive, chunked responses.
 *
 * Endpoints:
 *   POST /v1/chat/completions   streamed when the body has "stream":true
 *   GET  /__stats               {"requests":..,"open":..,"max_open":..,...}
 *   POST /__reset               zeroes the counters
 *
 * Knobs, as in scripts/fake_llm.py (header X-Fake-Scenario: k=v;k=v, or model
 * name "fake/k=v,k=v", over --defaults): latency_ms (before the headers),
 * ttft_ms (headers to first token), tokens, tps (tokens/s after the first;
 * 0 = all at once). One knob of its own: tick_ms (default 50), the shortest
 * gap between two writes to one stream. Tokens that fall due within a tick go
 * out in one write, each still its own SSE event, as a batching inference
 * server does; without it 10,000 paced streams would cost this process more
 * CPU than the worker under test. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <uv.h>

#define MAX_REQ_BYTES (1u << 20)
#define READ_CHUNK 4096

struct knobs {
    double latency_ms;
    double ttft_ms;
    double tps;
    double tick_ms;
    int tokens;
};

enum conn_state {
    ST_HEAD,      /* reading request line and headers */
    ST_BODY,      /* reading Content-Length bytes */
    ST_WAIT,      /* latency before the headers */
    ST_STREAMING, /* headers sent, tokens going out */
    ST_CLOSING,
};

struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    enum conn_state state;
    char *in; /* request bytes not consumed yet */
    size_t in_len, in_cap;
    size_t head_len, body_len;
    int keepalive;
    int stream;
    int usage;
    struct knobs k;
    int sent;         /* content tokens sent */
    uint64_t t_first; /* when the first token is due (loop ms) */
    int closes;       /* handles closed so far (two: tcp, timer) */
};

struct stats {
    unsigned long long requests, tokens, bytes, writes, accepted;
    long open, max_open, conns, max_conns;
};

static uv_loop_t *loop;
static struct knobs defaults = {0, 0, 0, 50, 16};
static struct stats st;

static const char *const words[] = {"lorem ", "ipsum ", "dolor ", "sit ",   "amet ",
                                    "elit ",  "sed ",   "do ",    "magna ", "aliqua "};

/* ------------------------------------------------------------- knobs */

static void set_knob(struct knobs *k, const char *key, size_t klen, const char *val)
{
    double v = strtod(val, NULL);
#define IS(name) (klen == sizeof(name) - 1 && !memcmp(key, name, klen))
    if (IS("latency_ms") || IS("latency"))
        k->latency_ms = v;
    else if (IS("ttft_ms") || IS("ttft"))
        k->ttft_ms = v;
    else if (IS("tps"))
        k->tps = v;
    else if (IS("tick_ms"))
        k->tick_ms = v;
    else if (IS("tokens"))
        k->tokens = (int)v;
#undef IS
}

/* Parses "k=v,k=v" (or ';'-separated) up to `end`. Unknown knobs are ignored:
 * a benchmark server need not police its callers. */
static void parse_knobs(struct knobs *k, const char *s, const char *end)
{
    while (s < end) {
        const char *sep = s, *eq;
        char val[32];
        size_t vlen;
        while (sep < end && *sep != ',' && *sep != ';')
            sep++;
        eq = memchr(s, '=', (size_t)(sep - s));
        if (eq) {
            vlen = (size_t)(sep - eq - 1);
            if (vlen >= sizeof(val))
                vlen = sizeof(val) - 1;
            memcpy(val, eq + 1, vlen);
            val[vlen] = '\0';
            set_knob(k, s, (size_t)(eq - s), val);
        }
        s = sep + 1;
    }
}

/* ------------------------------------------------------------ writing */

static void on_write(uv_write_t *w, int status)
{
    (void)status;
    free(w);
}

/* Sends bytes now if the socket takes them; copies the rest. */
static void send_bytes(struct conn *c, const char *data, size_t len)
{
    uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
    int n;
    if (c->state == ST_CLOSING)
        return;
    st.bytes += len;
    st.writes++;
    n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    if (n == (int)len)
        return;
    if (n < 0 && n != UV_EAGAIN)
        return; /* the read side sees the error and closes */
    if (n < 0)
        n = 0;
    {
        uv_write_t *w = malloc(sizeof(*w) + len - (size_t)n);
        char *copy;
        if (!w)
            return;
        copy = (char *)(w + 1);
        memcpy(copy, data + n, len - (size_t)n);
        b = uv_buf_init(copy, (unsigned)(len - (size_t)n));
        uv_write(w, (uv_stream_t *)&c->tcp, &b, 1, on_write);
    }
}

struct out {
    char *p;
    size_t len, cap;
};

static void out_add(struct out *o, const char *s, size_t n)
{
    if (o->len + n > o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 1024;
        while (cap < o->len + n)
            cap *= 2;
        o->p = realloc(o->p, cap);
        if (!o->p) {
            fprintf(stderr, "fake_fast: out of memory\n");
            exit(1);
        }
        o->cap = cap;
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
}

static void out_str(struct out *o, const char *s)
{
    out_add(o, s, strlen(s));
}

/* Appends one HTTP chunk holding `payload`. */
static void out_chunk(struct out *o, const char *payload, size_t n)
{
    char hdr[24];
    int h = snprintf(hdr, sizeof(hdr), "%zx\r\n", n);
    out_add(o, hdr, (size_t)h);
    out_add(o, payload, n);
    out_add(o, "\r\n", 2);
}

static struct out scratch;  /* one response write being built */
static struct out eventbuf; /* SSE events of that write */

#define CHUNK_HEAD                                                                       \
    "data: {\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\","              \
    "\"created\":1700000000,\"model\":\"fake\",\"choices\":[{\"index\":0,"

static void ev_token(int i)
{
    out_str(&eventbuf, CHUNK_HEAD "\"delta\":{\"content\":\"");
    out_str(&eventbuf, words[i % 10]);
    out_str(&eventbuf, "\"},\"finish_reason\":null}]}\n\n");
}

static void request_done(struct conn *c);

/* ------------------------------------------------------------ streaming */

static void stream_tick(uv_timer_t *t);

static void finish_stream(struct conn *c)
{
    char usage[256];
    eventbuf.len = 0;
    out_str(&eventbuf, CHUNK_HEAD "\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n");
    if (c->usage) {
        snprintf(usage, sizeof(usage),
                 "data: {\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\","
                 "\"model\":\"fake\",\"choices\":[],\"usage\":{\"prompt_tokens\":8,"
                 "\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n",
                 c->k.tokens, c->k.tokens + 8);
        out_str(&eventbuf, usage);
    }
    out_str(&eventbuf, "data: [DONE]\n\n");
    scratch.len = 0;
    out_chunk(&scratch, eventbuf.p, eventbuf.len);
    out_str(&scratch, "0\r\n\r\n");
    send_bytes(c, scratch.p, scratch.len);
    request_done(c);
}

/* Sends every token due by now, then sleeps until the next one (at least
 * tick_ms), or finishes the response. */
static void send_due(struct conn *c)
{
    uint64_t now = uv_now(loop);
    int due, n = 0;
    if (now < c->t_first) {
        uv_timer_start(&c->timer, stream_tick, c->t_first - now, 0);
        return;
    }
    if (c->k.tps <= 0)
        due = c->k.tokens;
    else
        due = 1 + (int)((double)(now - c->t_first) * c->k.tps / 1000.0);
    if (due > c->k.tokens)
        due = c->k.tokens;
    eventbuf.len = 0;
    while (c->sent < due) {
        ev_token(c->sent++);
        n++;
    }
    if (n) {
        scratch.len = 0;
        out_chunk(&scratch, eventbuf.p, eventbuf.len);
        send_bytes(c, scratch.p, scratch.len);
        st.tokens += (unsigned long long)n;
    }
    if (c->sent >= c->k.tokens) {
        finish_stream(c);
        return;
    }
    {
        double next = (double)c->t_first + (double)c->sent * 1000.0 / c->k.tps;
        double wait = next - (double)now;
        if (wait < c->k.tick_ms)
            wait = c->k.tick_ms;
        uv_timer_start(&c->timer, stream_tick, (uint64_t)(wait + 0.999), 0);
    }
}

static void stream_tick(uv_timer_t *t)
{
    send_due(t->data);
}

static void start_response(struct conn *c)
{
    scratch.len = 0;
    if (!c->stream) {
        char body[512];
        int n = snprintf(
            body, sizeof(body),
            "{\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion\",\"created\":"
            "1700000000,\"model\":\"fake\",\"choices\":[{\"index\":0,\"message\":"
            "{\"role\":\"assistant\",\"content\":\"lorem "
            "\"},\"finish_reason\":\"stop\"}],"
            "\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":1,\"total_tokens\":9}"
            "}");
        char head[160];
        int h = snprintf(head, sizeof(head),
                         "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         "Content-Length: %d\r\n\r\n",
                         n);
        out_add(&scratch, head, (size_t)h);
        out_add(&scratch, body, (size_t)n);
        send_bytes(c, scratch.p, scratch.len);
        st.tokens++;
        request_done(c);
        return;
    }
    out_str(&scratch, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                      "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n");
    eventbuf.len = 0;
    out_str(&eventbuf, CHUNK_HEAD "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                                  "\"finish_reason\":null}]}\n\n");
    out_chunk(&scratch, eventbuf.p, eventbuf.len);
    send_bytes(c, scratch.p, scratch.len);
    c->state = ST_STREAMING;
    c->sent = 0;
    c->t_first = uv_now(loop) + (uint64_t)c->k.ttft_ms;
    send_due(c);
}

static void wait_done(uv_timer_t *t)
{
    start_response(t->data);
}

/* ------------------------------------------------------------- requests */

static void on_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    if (++c->closes == 2) {
        free(c->in);
        free(c);
    }
}

static void conn_close(struct conn *c)
{
    if (c->state == ST_CLOSING)
        return;
    if (c->state == ST_WAIT || c->state == ST_STREAMING)
        st.open--;
    c->state = ST_CLOSING;
    st.conns--;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->tcp, on_closed);
    uv_close((uv_handle_t *)&c->timer, on_closed);
}

static void simple_reply(struct conn *c, int status, const char *ctype, const char *body)
{
    char head[200];
    int h = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                     status, status == 200 ? "OK" : "Not Found", ctype, strlen(body));
    scratch.len = 0;
    out_add(&scratch, head, (size_t)h);
    out_str(&scratch, body);
    send_bytes(c, scratch.p, scratch.len);
}

static void handle_request(struct conn *c);

/* Drops the finished request's bytes and serves any pipelined one. */
static void request_done(struct conn *c)
{
    size_t used = c->head_len + c->body_len;
    if (c->state == ST_WAIT || c->state == ST_STREAMING)
        st.open--;
    memmove(c->in, c->in + used, c->in_len - used);
    c->in_len -= used;
    c->head_len = c->body_len = 0;
    c->state = ST_HEAD;
    if (!c->keepalive) {
        conn_close(c);
        return;
    }
    handle_request(c);
}

static const char *find_header(const char *head, size_t len, const char *name,
                               size_t *vlen)
{
    size_t n = strlen(name);
    const char *p = head, *end = head + len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            break;
        if ((size_t)(eol - p) > n && p[n] == ':' && !strncasecmp(p, name, n)) {
            const char *v = p + n + 1;
            while (v < eol && *v == ' ')
                v++;
            *vlen = (size_t)(eol - v);
            if (*vlen && v[*vlen - 1] == '\r')
                (*vlen)--;
            return v;
        }
        p = eol + 1;
    }
    return NULL;
}

static const char *memstr(const char *h, size_t hlen, const char *needle)
{
    size_t n = strlen(needle);
    if (hlen < n)
        return NULL;
    for (size_t i = 0; i + n <= hlen; i++)
        if (h[i] == needle[0] && !memcmp(h + i, needle, n))
            return h + i;
    return NULL;
}

static void serve(struct conn *c)
{
    const char *body = c->in + c->head_len;
    size_t vlen;
    const char *v;

    st.requests++;
    if (!strncmp(c->in, "GET /__stats", 12)) {
        char js[400];
        snprintf(js, sizeof(js),
                 "{\"requests\":%llu,\"tokens\":%llu,\"bytes\":%llu,\"writes\":%llu,"
                 "\"accepted\":%llu,\"open\":%ld,\"max_open\":%ld,\"conns\":%ld,"
                 "\"max_conns\":%ld}",
                 st.requests, st.tokens, st.bytes, st.writes, st.accepted, st.open,
                 st.max_open, st.conns, st.max_conns);
        simple_reply(c, 200, "application/json", js);
        request_done(c);
        return;
    }
    if (!strncmp(c->in, "POST /__reset", 13)) {
        long open = st.open, conns = st.conns;
        memset(&st, 0, sizeof(st));
        st.open = st.max_open = open;
        st.conns = st.max_conns = conns;
        simple_reply(c, 200, "application/json", "{}");
        request_done(c);
        return;
    }
    if (strncmp(c->in, "POST /v1/chat/completions", 25)) {
        simple_reply(c, 404, "application/json",
                     "{\"error\":{\"message\":\"no such path\"}}");
        request_done(c);
        return;
    }
    c->k = defaults;
    /* The model name "fake/k=v,..." (any JSON spacing around it). */
    v = memstr(body, c->body_len, "\"fake/");
    if (v) {
        const char *s = v + 6, *e = memchr(s, '"', c->body_len - (size_t)(s - body));
        if (e)
            parse_knobs(&c->k, s, e);
    }
    v = find_header(c->in, c->head_len, "x-fake-scenario", &vlen);
    if (v)
        parse_knobs(&c->k, v, v + vlen);
    c->stream = memstr(body, c->body_len, "\"stream\":true") ||
                memstr(body, c->body_len, "\"stream\": true");
    c->usage = memstr(body, c->body_len, "\"include_usage\":true") ||
               memstr(body, c->body_len, "\"include_usage\": true");
    c->state = ST_WAIT;
    if (++st.open > st.max_open)
        st.max_open = st.open;
    if (c->k.latency_ms > 0)
        uv_timer_start(&c->timer, wait_done, (uint64_t)c->k.latency_ms, 0);
    else
        start_response(c);
}

/* Parses as much of the buffered input as is there. */
static void handle_request(struct conn *c)
{
    if (c->state == ST_HEAD) {
        const char *end = memstr(c->in, c->in_len, "\r\n\r\n");
        size_t vlen;
        const char *v;
        if (!end)
            return;
        c->head_len = (size_t)(end - c->in) + 4;
        v = find_header(c->in, c->head_len, "content-length", &vlen);
        c->body_len = v ? strtoul(v, NULL, 10) : 0;
        v = find_header(c->in, c->head_len, "connection", &vlen);
        c->keepalive = !(v && vlen == 5 && !strncasecmp(v, "close", 5)) &&
                       !memstr(c->in, c->head_len, "HTTP/1.0");
        if (c->head_len + c->body_len > MAX_REQ_BYTES) {
            conn_close(c);
            return;
        }
        c->state = ST_BODY;
    }
    if (c->state == ST_BODY && c->in_len >= c->head_len + c->body_len)
        serve(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = h->data;
    (void)suggested;
    if (c->in_cap - c->in_len < READ_CHUNK) {
        size_t cap = c->in_cap ? c->in_cap * 2 : READ_CHUNK * 2;
        char *p = realloc(c->in, cap);
        if (!p) {
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        c->in = p;
        c->in_cap = cap;
    }
    *buf = uv_buf_init(c->in + c->in_len, (unsigned)(c->in_cap - c->in_len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    (void)buf;
    if (n < 0) {
        conn_close(c);
        return;
    }
    c->in_len += (size_t)n;
    if (c->state == ST_HEAD || c->state == ST_BODY)
        handle_request(c);
}

static void on_connection(uv_stream_t *server, int status)
{
    struct conn *c;
    if (status < 0)
        return;
    c = calloc(1, sizeof(*c));
    if (!c)
        return;
    uv_tcp_init(loop, &c->tcp);
    uv_timer_init(loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp)) {
        c->state = ST_HEAD;
        st.conns++;
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    st.accepted++;
    if (++st.conns > st.max_conns)
        st.max_conns = st.conns;
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void on_signal(uv_signal_t *s, int signum)
{
    (void)signum;
    uv_stop(s->loop);
}

int main(int argc, char **argv)
{
    struct sockaddr_in addr;
    struct rlimit rl;
    uv_tcp_t server;
    uv_signal_t sig;
    int port = 0, rc;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--port") && i + 1 < argc)
            port = (int)strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--defaults") && i + 1 < argc) {
            i++;
            parse_knobs(&defaults, argv[i], argv[i] + strlen(argv[i]));
        } else {
            fprintf(stderr, "usage: fake_fast [--port N] [--defaults 'k=v,k=v']\n");
            return 2;
        }
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    loop = uv_default_loop();
    uv_tcp_init(loop, &server);
    uv_ip4_addr("127.0.0.1", port, &addr);
    if ((rc = uv_tcp_bind(&server, (const struct sockaddr *)&addr, 0)) ||
        (rc = uv_listen((uv_stream_t *)&server, 4096, on_connection))) {
        fprintf(stderr, "fake_fast: cannot listen on port %d: %s\n", port,
                uv_strerror(rc));
        return 1;
    }
    {
        struct sockaddr_storage ss;
        int len = sizeof(ss);
        uv_tcp_getsockname(&server, (struct sockaddr *)&ss, &len);
        printf("PORT %d\n", ntohs(((struct sockaddr_in *)&ss)->sin_port));
        fflush(stdout);
    }
    uv_signal_init(loop, &sig);
    uv_signal_start(&sig, on_signal, SIGTERM);
    uv_run(loop, UV_RUN_DEFAULT);
    return 0;
}
