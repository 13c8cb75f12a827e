/* kombu.h -- kombu's Redis transport on the wire: the message envelope, the
 * unacked entries, the names of keys and pub/sub channels, priority buckets,
 * binding members, the BRPOP key order and the transport options. Pure: no I/O,
 * no clock, no globals.
 *
 * The facts (checked against kombu 5.2.4 and 5.6.2, with a capture of what a
 * real producer and worker write) are summed up in docs/internals/redis-broker.md. The
 * short version: every message is one JSON "envelope" string pushed on a list
 * (LPUSH) and popped from its right end (BRPOP); a consumer with acks records
 * what it popped in a hash (`unacked`, tag -> [envelope, exchange, routing
 * key]) and a sorted set (`unacked_index`, tag -> time), and acks by removing
 * both. Every key and channel carries the global_keyprefix. */
#ifndef CR_KOMBU_H
#define CR_KOMBU_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "../util/buf.h"
#include "../util/err.h"
#include "message.h"

/* ------------------------------------------------------------ options */

#define KOMBU_MAX_STEPS 10         /* priorities are 0..9, so at most ten buckets */
#define KOMBU_PRIORITY_MAX 9       /* kombu clamps message priorities to 0..9 */
#define KOMBU_NAME_MAX 256         /* a queue, exchange or key name longer is refused */
#define KOMBU_OPTS_MAX_BYTES 65536 /* a longer options document is refused whole */

enum kombu_order {
    KOMBU_ORDER_ROUND_ROBIN, /* the queue a message came from moves last */
    KOMBU_ORDER_PRIORITY,    /* the -Q order, never rotated */
    KOMBU_ORDER_SORTED,      /* alphabetical, never rotated */
};

/* Celery's broker_transport_options for the Redis transport, parsed. Every
 * string is NUL-terminated and "" when not given. */
struct kombu_opts {
    double visibility_timeout_s; /* 3600 */
    int steps[KOMBU_MAX_STEPS];  /* priority_steps, ascending, steps[0] == 0:
                                  * {0, 3, 6, 9} */
    int nsteps;
    char sep[16];                   /* "\x06\x16" */
    enum kombu_order order;         /* queue_order_strategy: round_robin */
    char keyprefix[KOMBU_NAME_MAX]; /* global_keyprefix: "" */
    /* fanout_prefix: 1 (true: "/{db}."), 0 (false, or ""; none), or 2: a
     * string of its own in fanout_prefix_str (kombu formats "{db}" in it; any
     * other brace but "{{" and "}}" is refused, as Python's format raises). */
    int fanout_prefix;
    char fanout_prefix_str[64];
    int fanout_patterns;                    /* 1: "/routing_key" suffix on channels */
    char unacked_key[KOMBU_NAME_MAX];       /* "unacked" */
    char unacked_index_key[KOMBU_NAME_MAX]; /* "unacked_index" */
    char unacked_mutex_key[KOMBU_NAME_MAX]; /* "unacked_mutex" */
    double unacked_mutex_expire_s;          /* 300 */
    long unacked_restore_limit;             /* 0: no LIMIT */
    int ack_emulation;                      /* 1: record unacked entries */
    double polling_interval_s;              /* 0: BRPOP timeout 1 s */
    /* connection options */
    char master_name[KOMBU_NAME_MAX]; /* Sentinel: required with sentinel:// */
    char sentinel_username[256];      /* sentinel_kwargs.username */
    char sentinel_password[512];      /* sentinel_kwargs.password */
    int min_other_sentinels;          /* 0 */
    double socket_timeout_s;          /* 0: the worker's default */
    double socket_connect_timeout_s;  /* 0: the worker's default */
    double health_check_interval_s;   /* 25 */
    char client_name[KOMBU_NAME_MAX]; /* "" */
};

/* Sets kombu's defaults. */
void kombu_opts_init(struct kombu_opts *o);

/* Parses a broker_transport_options JSON object (len bytes, no NUL needed)
 * over the defaults already in o. Keys kombu accepts for pools and sockets
 * that mean nothing here (max_connections, socket_keepalive, retry_on_timeout,
 * ..., and the publish retry policy max_retries and interval_*) are accepted
 * and ignored. Any other key, a value of the wrong type or
 * out of range is CR_EINVAL with one line naming the key in err; o is then
 * unspecified. */
int kombu_opts_parse(struct kombu_opts *o, const char *json, size_t len,
                     struct cr_err *err);

/* ------------------------------------------------------------ envelope */

/* A decoded envelope. Every pointer is owned by the message ("" when the
 * envelope has none, never NULL, except headers). */
struct kombu_msg {
    char *body; /* decoded (base64 unless body_encoding says utf-8), NUL-terminated */
    size_t body_len;
    char *content_type;
    char *content_encoding;
    cJSON *headers; /* "headers" as JSON (py_json_parse: floats keep their bit),
                     * or NULL when absent or null; the caller may take it (set
                     * NULL) */
    char *correlation_id;
    char *reply_to;
    char *expiration;
    int delivery_mode;  /* 0 when absent */
    int priority;       /* kombu's scale (0 most urgent), clamped 0..9; 0 when
                         * absent or not an integer */
    char *exchange;     /* properties.delivery_info.exchange */
    char *routing_key;  /* properties.delivery_info.routing_key */
    char *delivery_tag; /* properties.delivery_tag */
    int redelivered;    /* headers.redelivered or delivery_info.redelivered true */
};

/* Decodes one envelope (len bytes). A body longer than max_body_bytes once
 * decoded is CR_ETOOBIG (0: no limit). Returns 0; CR_EDECODE with one line in
 * err (not JSON, not an object, no delivery tag, a body that is not a string or
 * not base64); CR_ENOMEM. On error m is released. */
int kombu_msg_decode(struct kombu_msg *m, const char *env, size_t len,
                     size_t max_body_bytes, struct cr_err *err);
void kombu_msg_release(struct kombu_msg *m);

/* kombu_msg_decode with flags. KOMBU_DECODE_ANY_TAG: an envelope without a
 * delivery tag (absent or null) decodes, its delivery_tag reading "" -- on SQS
 * the receiver sets the tag from the receipt handle, so a producer may leave
 * it out. */
#define KOMBU_DECODE_ANY_TAG 1u
int kombu_msg_decode_flags(struct kombu_msg *m, const char *env, size_t len,
                           size_t max_body_bytes, unsigned flags, struct cr_err *err);

/* Moves m's message into d, which takes its strings, headers and body (m
 * keeps the rest and is still released by its owner): exchange, routing key,
 * the properties (an empty one is absent, as kombu writes it), delivery
 * mode, the wire priority, and the redelivered flag. The transport sets the
 * rest (queue, record, engine priority, times, caps). */
void kombu_msg_move_to(struct kombu_msg *m, struct delivery *d);

/* Fills o with m's message as it was published (body, properties, headers,
 * exchange and routing key), every pointer borrowed from m; an empty
 * expiration is none. To send a decoded message on again (a dead letter
 * replayed, a round trip). */
void kombu_msg_outbound(const struct kombu_msg *m, struct outbound *o);

/* Appends the envelope of o (borrowed for the call) as kombu writes it
 * (json.dumps spacing, body in base64, body_encoding "base64"), with
 * delivery_tag (a fresh uuid4 per publish, the caller's). A property o omits
 * is written as kombu writes an absent one: content type "application/json",
 * encoding "utf-8", headers {}, delivery mode 2; exchange and routing key "";
 * the priority is kombu's scale, clamped to 0..9. Returns 0 or CR_ENOMEM. */
int kombu_msg_encode(const struct outbound *o, const char *delivery_tag, struct buf *out);

/* Appends env (len bytes) with headers.redelivered and
 * properties.delivery_info.redelivered set to true, everything else kept, as
 * kombu's restore and requeue write it. Returns 0, CR_EDECODE (not an
 * envelope) or CR_ENOMEM. */
int kombu_mark_redelivered(const char *env, size_t len, struct buf *out,
                           struct cr_err *err);

/* The `unacked` hash value: [envelope, exchange, routing_key], the envelope
 * embedded as JSON (not as a string). Appends it. Returns 0 or CR_ENOMEM
 * (CR_EDECODE when env is not JSON). */
int kombu_unacked_encode(const char *env, size_t len, const char *exchange,
                         const char *routing_key, struct buf *out, struct cr_err *err);

/* Splits an `unacked` value: *env (new, NUL-terminated, compact or as stored:
 * any JSON text of the envelope) and the exchange and routing key (new).
 * Returns 0, CR_EDECODE (not a 3-array of object, string, string; a null
 * exchange or routing key reads "", as kombu routes None as the nameless
 * exchange) or CR_ENOMEM; nothing to free on error. */
int kombu_unacked_decode(const char *value, size_t len, char **env, char **exchange,
                         char **routing_key, struct cr_err *err);

/* ------------------------------------------------------------ priorities */

/* The bucket of a message priority: the largest step <= clamp(p, 0, 9). */
int kombu_bucket(const struct kombu_opts *o, int priority);

/* kombu's priority (0 most urgent) on the engine's scale (higher = more
 * urgent, struct delivery): 9 - clamp(p, 0, 9). And back. */
int kombu_to_engine_priority(int kombu_priority);
int kombu_from_engine_priority(int engine_priority);

/* ------------------------------------------------------------ names */

/* Appends prefix + queue, or prefix + queue + sep + bucket for a bucket other
 * than 0. Returns 0 or CR_ENOMEM. */
int kombu_queue_key(const struct kombu_opts *o, const char *queue, int bucket,
                    struct buf *out);

/* The queue a BRPOP reply's key names: the prefix stripped, then everything
 * from the last sep on when what follows it is a step of o. Writes it into out
 * (NUL-terminated). Returns 0, or CR_EINVAL when the key does not carry the
 * prefix or the queue does not fit in out_size. */
int kombu_queue_of_key(const struct kombu_opts *o, const char *key, size_t len, char *out,
                       size_t out_size);

/* The BRPOP arguments for queues given in cycle order: for each step, for
 * each queue, its key; then the timeout (seconds, decimal). Appends each
 * argument NUL-terminated into store and sets argv/argvlen (n_queues * nsteps
 * + 2 entries, argv[0] = "BRPOP") pointing into it: they stay valid until
 * store changes. Returns the argument count, or CR_ENOMEM / CR_ERANGE (more
 * than max_args). */
int kombu_brpop_args(const struct kombu_opts *o, const char *const *queues, int n_queues,
                     double timeout_s, struct buf *store, const char **argv,
                     size_t *argvlen, int max_args);

/* Rotates the cycle after a pop from queue (round_robin: that queue moves to
 * the end; the other orders leave it as it is). A queue not in the cycle
 * changes nothing. */
void kombu_rotate(const struct kombu_opts *o, const char **queues, int n_queues,
                  const char *queue);

/* Sorts queues for KOMBU_ORDER_SORTED (strcmp); leaves them for the others. */
void kombu_initial_order(const struct kombu_opts *o, const char **queues, int n_queues);

/* Appends prefix + "_kombu.binding." + exchange. */
int kombu_binding_key(const struct kombu_opts *o, const char *exchange, struct buf *out);

/* Appends routing_key + sep + pattern + sep + queue (NULL reads ""). kombu
 * joins and splits binding members with the channel's sep option, the same
 * o->sep as the priority lists ("\x06\x16" by default). */
int kombu_binding_member(const struct kombu_opts *o, const char *routing_key,
                         const char *pattern, const char *queue, struct buf *out);

/* Splits a binding member at o->sep into its three fields (pointers into
 * member, lengths in *_len). Returns 0, or CR_EDECODE when it does not have
 * exactly three. */
int kombu_binding_parse(const struct kombu_opts *o, const char *member, size_t len,
                        const char **routing_key, size_t *rk_len, const char **pattern,
                        size_t *pattern_len, const char **queue, size_t *queue_len);

/* kombu's topic binding: the regex kombu stores as the pattern field for a
 * binding key ("task.#" -> "^task\..*?$"), appended. */
int kombu_topic_pattern(const char *binding_key, struct buf *out);

/* Whether routing_key matches a topic binding key the way kombu's regex does
 * with re.match ('#': any run of characters but a newline, dots included,
 * possibly empty; '*': one or more characters ending in one that is not a dot,
 * dots allowed before it; words literal, except that a '*' inside a word
 * repeats the character before it, as the regex reads it; '$' also matches
 * before a final newline; a key whose regex does not compile matches nothing;
 * both keys strict UTF-8, compared by code point). Bounded: O(len(binding_key) *
 * len(routing_key)) time, no allocation; keys longer than KOMBU_NAME_MAX do not match. */
int kombu_topic_match(const char *binding_key, size_t bk_len, const char *routing_key,
                      size_t rk_len);

/* The pub/sub channel of a fanout publish: prefix + fanout prefix (with db)
 * + exchange [+ "/" + routing_key when fanout_patterns and the key is not
 * empty], appended. A db < 0 leaves "{db}" unformatted: the channel kombu
 * < 5.4 uses on Sentinel ("/{db}.celery.pidbox"). */
int kombu_channel(const struct kombu_opts *o, int db, const char *exchange,
                  const char *routing_key, struct buf *out);

/* The PSUBSCRIBE pattern of a fanout queue bound with binding_key ('#'
 * becomes '*'), appended. */
int kombu_channel_pattern(const struct kombu_opts *o, int db, const char *exchange,
                          const char *binding_key, struct buf *out);

/* The exchange and routing key a received channel names (prefix stripped;
 * a leading "/..." up to the first '.' dropped; the exchange runs to the
 * first '/'). Written NUL-terminated into the two buffers. Returns 0 or
 * CR_EINVAL (no prefix, no exchange, or a part does not fit). */
int kombu_channel_parse(const struct kombu_opts *o, const char *channel, size_t len,
                        char *exchange, size_t exchange_size, char *routing_key,
                        size_t rk_size);

/* ------------------------------------------------------------ restore */

/* Whether an `unacked_index` entry with score (Unix seconds) is old enough to
 * restore at now_s: 0 <= score <= now_s - visibility_timeout (the range kombu's
 * ZREVRANGEBYSCORE reads). */
int kombu_restore_due(const struct kombu_opts *o, double score, double now_s);

#endif
