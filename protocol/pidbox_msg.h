/* pidbox_msg.h -- Celery remote control (kombu pidbox) messages: the request a
 * client broadcasts, whether it is for this node, the reply body, and the reply
 * shapes of the inspect and control commands exactly as the Python worker
 * answers them (shared/reference/celery-protocol.md, section 6). Also the text
 * format of the revoked-ids state file. Pure: no I/O, no clock.
 *
 * Builders return new cJSON values (free with cJSON_Delete()) or NULL on OOM. */
#ifndef CR_PIDBOX_MSG_H
#define CR_PIDBOX_MSG_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "../util/buf.h"
#include "../util/err.h"

/* ------------------------------------------------------------- requests */

/* One decoded request. Every pointer is borrowed from the request itself and
 * valid until pidbox_request_release(). */
struct pidbox_request {
    /* read-only */
    const char *method;
    const cJSON *arguments;        /* an object; {} when absent or null */
    const cJSON *destination;      /* array of node names, or NULL (broadcast) */
    const char *pattern;           /* NULL unless set */
    const char *matcher;           /* "glob", "pcre" or NULL */
    const char *ticket;            /* NULL for casts (no reply wanted) */
    const char *reply_exchange;    /* set together with reply_routing_key, */
    const char *reply_routing_key; /* only when a reply is wanted */
    /* private */
    cJSON *root;
    cJSON *empty;
};

/* Parses a request body (strict JSON, see py_json_parse()). rq is
 * overwritten; release it with pidbox_request_release() in every case.
 * Returns 0; CR_EDECODE (not JSON); CR_EPROTO (not an object, no string
 * "method", arguments not an object, destination not a list of strings,
 * reply_to without string exchange and routing_key) with detail in err; or
 * CR_ENOMEM. */
int pidbox_request_parse(const char *body, size_t len, struct pidbox_request *rq,
                         struct cr_err *err);
void pidbox_request_release(struct pidbox_request *rq);

/* The longest pattern a request may match with; a longer one matches nothing.
 * A node-name pattern is a few dozen bytes. */
#define PIDBOX_PATTERN_MAX 1024

/* The compiled pcre patterns of the last few distinct requests, so a burst of
 * one pattern compiles it once, and the verdict for the last node name each
 * was matched against. Bounded: a few entries of at most PIDBOX_PATTERN_MAX
 * bytes of pattern each, and PCRE2's own limits on compiled size and on the
 * work and memory of one match. Not thread-safe; one per mailbox. */
struct pidbox_matcher;

/* Returns a new, empty cache, or NULL on OOM. Free with pidbox_matcher_free()
 * (NULL is a no-op). */
struct pidbox_matcher *pidbox_matcher_new(void);
void pidbox_matcher_free(struct pidbox_matcher *pm);

/* kombu's Node.handle_message test: with a non-empty destination, whether
 * nodename is listed; else with a non-empty pattern and matcher, whether they
 * match; else 1 (a broadcast). glob is Python's fnmatch ('*', '?', "[seq]",
 * "[!seq]", a backslash is literal), matched without backtracking; pcre is a
 * PCRE2 pattern anchored at the start but not at the end, as Python's re.match,
 * in UTF mode, with at most 32 capturing groups and groups nested at most 32
 * deep. pm may be NULL (then a pcre pattern is compiled for the call).
 * Returns 1 or 0; or, meaning "not for this node" too, with detail in err:
 * CR_ETOOBIG (pattern longer than PIDBOX_PATTERN_MAX), CR_EINVAL (an unknown
 * matcher, or a pcre pattern that does not compile), CR_ERANGE (the match hit
 * PCRE2's work, depth or heap limit) or CR_ENOMEM. A failure is returned on
 * every call with the same pattern (from the cache when pm holds it). */
int pidbox_match(struct pidbox_matcher *pm, const struct pidbox_request *rq,
                 const char *nodename, struct cr_err *err);
/* pidbox_match() without a cache: 1 when it returns 1, else 0. */
int pidbox_request_matches(const struct pidbox_request *rq, const char *nodename);

/* ------------------------------------------------------------ arguments */

/* Reads arguments[name] as a string. Returns 1 and sets *out (borrowed from
 * args), 0 when absent or null, CR_EINVAL when of another type. */
int pidbox_arg_str(const cJSON *args, const char *name, const char **out);
/* Reads a number; a string holding a number is accepted too. 1, 0 or CR_EINVAL. */
int pidbox_arg_num(const cJSON *args, const char *name, double *out);
/* Reads a bool (true/false, 0/1, "true"/"false"). 1, 0 or CR_EINVAL. */
int pidbox_arg_bool(const cJSON *args, const char *name, int *out);
/* Reads a task id or a list of them into *ids, a new array of distinct strings
 * in first-seen order. Returns 1, 0 (absent or null; *ids = NULL), CR_EINVAL
 * (another type, or a non-string in the list) or CR_ENOMEM. */
int pidbox_arg_ids(const cJSON *args, const char *name, cJSON **ids);

/* --------------------------------------------------------------- replies */

/* Appends the reply body {"<nodename>": reply} (reply NULL writes null).
 * Returns 0 or CR_ENOMEM. */
int pidbox_reply_encode(const char *nodename, const cJSON *reply, struct buf *out);

/* {"ok": text} and {"error": text}. */
cJSON *pidbox_ok(const char *text);
cJSON *pidbox_error(const char *text);
/* {"error": "<Type>('<message>')"}, the repr of a Python exception, as kombu
 * sends when a handler raises (e.g. KeyError('no_such_command')). */
cJSON *pidbox_error_exc(const char *exc_type, const char *message);

/* The revoke reply. ids: every id asked for; with terminate, terminated: the
 * ids that were found (running or waiting) and stopped.
 *   no terminate:  {"ok": "tasks a, b flagged as revoked"}
 *   terminate:     {"ok": "terminate: a, b"} or {"ok": "terminate: tasks unknown"} */
cJSON *pidbox_revoke_reply(const cJSON *ids, int terminate, const cJSON *terminated);

/* A request-info object (Request.info()). Strings borrowed for the call. */
struct pidbox_task_info {
    const char *id;
    const char *name;
    const cJSON *args;      /* JSON array; NULL writes [] */
    const cJSON *kwargs;    /* JSON object; NULL writes {} */
    const char *argsrepr;   /* for safe=1; NULL: derived from args */
    const char *kwargsrepr; /* for safe=1; NULL: derived from kwargs */
    const char *hostname;
    double time_start; /* epoch seconds; < 0 writes null */
    int acknowledged;
    const char *exchange;
    const char *routing_key;
    int priority;
    int redelivered;
    long worker_pid; /* <= 0 writes null */
};
/* With safe set, args and kwargs are the repr strings (as Flower asks). */
cJSON *pidbox_task_info_new(const struct pidbox_task_info *ti, int safe);

/* One item of inspect scheduled: {"eta", "priority", "request"}; takes request
 * (freed on failure too). */
cJSON *pidbox_scheduled_item_new(const char *eta, int priority, cJSON *request);

/* inspect registered: the names sorted, celery.* left out, and
 * " [rate_limit=<r>]" appended where rate_limits[i] is neither NULL nor "". */
cJSON *pidbox_registered_new(const char *const *names, const char *const *rate_limits,
                             int n);

/* A consumed queue as kombu's Queue.as_dict(recurse=True). Borrowed strings. */
struct pidbox_queue_info {
    const char *name;
    const char *exchange;      /* "" for the default exchange */
    const char *exchange_type; /* "direct", "fanout", "topic" */
    int exchange_durable;
    const char *routing_key;
    int durable, exclusive, auto_delete, no_ack;
    const cJSON *arguments; /* queue arguments or NULL */
};
cJSON *pidbox_queue_info_new(const struct pidbox_queue_info *q);

/* What stats tells about the broker connection (no password, ever). */
struct pidbox_broker_info {
    char hostname[256];
    char userid[128];
    char virtual_host[256];
    int port;
    int ssl;
    char transport[16]; /* "amqp", "redis" or "sentinel", as kombu names it */
};
/* Reads an amqp://, amqps:// or pyamqp:// URL the way kombu does (defaults
 * localhost, guest, 5672/5671, vhost "/"; "amqp://h//" is vhost "/"; %XX
 * decoded), and the Redis forms: redis:// and rediss:// (port 6379, no
 * default user, the db as virtual host), sentinel:// (its first sentinel,
 * port 26379), redis+socket:// and unix:// (localhost). Returns 0 or
 * CR_EINVAL (another scheme). */
int pidbox_broker_info_parse(const char *url, struct pidbox_broker_info *out);

struct pidbox_rusage {
    double utime, stime;
    long maxrss, ixrss, idrss, isrss, minflt, majflt, nswap, inblock, oublock, msgsnd,
        msgrcv, nsignals, nvcsw, nivcsw;
};

/* Inputs of inspect stats; borrowed for the call. */
struct pidbox_stats {
    const cJSON *total; /* {task name: count} (copied); NULL writes {} */
    long pid;
    unsigned long clock; /* written as a string, as Celery does */
    long uptime_s;
    const char *pool_implementation;
    int max_concurrency;
    double soft_time_limit, hard_time_limit; /* pool "timeouts" */
    const struct pidbox_broker_info *broker;
    int broker_heartbeat;
    double broker_connect_timeout;
    int prefetch_count;
    const struct pidbox_rusage *rusage; /* NULL writes "N/A" */
};
cJSON *pidbox_stats_new(const struct pidbox_stats *st);

/* ------------------------------------------------------------- statedb */

/* The revoked-ids file: a first line "celeriac-statedb 1", then one line per
 * id, "revoked <expires_epoch_s> <id>". Appends the first line. */
int pidbox_statedb_header(struct buf *out);
/* Appends one id line; ids holding whitespace or control bytes, or longer
 * than 255 bytes, are skipped (returns 0 and writes nothing). 0 or CR_ENOMEM. */
int pidbox_statedb_line(const char *id, int64_t expires_epoch_s, struct buf *out);
/* Calls fn for each valid line whose expiry is after now_s; malformed lines
 * are skipped. Returns the number of ids passed to fn, or CR_EPROTO when the
 * first line is not the header. The id given to fn is borrowed for the call. */
int pidbox_statedb_parse(const char *text, size_t len, int64_t now_s,
                         void (*fn)(const char *id, int64_t expires_epoch_s, void *arg),
                         void *arg);

#endif
