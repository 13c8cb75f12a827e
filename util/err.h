/* err.h -- error codes and the caller-owned error context used by every module.
 *
 * Functions return 0 on success or a negative CR_E* code. Detail goes into a
 * struct cr_err owned by the caller; pure modules never log. */
#ifndef CR_ERR_H
#define CR_ERR_H

#include <stddef.h>

/* X(name, value, text). Ranges: -1..-99 general, -100.. protocol, -200.. broker,
 * -300.. backend, -400.. llm. */
#define CR_ERRNO_MAP(X)                                                                  \
    X(ENOMEM, -1, "out of memory")                                                       \
    X(EINVAL, -2, "invalid argument")                                                    \
    X(ERANGE, -3, "value out of range")                                                  \
    X(ETIMEDOUT, -4, "timed out")                                                        \
    X(ECANCELED, -5, "canceled")                                                         \
    X(EIO, -6, "i/o error")                                                              \
    X(ENOTFOUND, -7, "not found")                                                        \
    X(EPROTO, -100, "protocol error")                                                    \
    X(EDECODE, -101, "cannot decode message")                                            \
    X(ECONTENT, -102, "content type not allowed")                                        \
    X(ETOOBIG, -103, "message too large")                                                \
    X(EBROKER, -200, "broker error")                                                     \
    X(EQOS, -201, "global qos refused")                                                  \
    X(EBACKEND, -300, "result backend error")                                            \
    X(ELLM, -400, "llm provider error")                                                  \
    X(EPEER, -401, "peer refused")                                                       \
    X(EBUDGET, -402, "budget exceeded")                                                  \
    X(ECOOLED, -403, "provider cooled")

enum cr_errno {
    CR_OK = 0,
#define CR__X(name, val, text) CR_##name = (val),
    CR_ERRNO_MAP(CR__X)
#undef CR__X
};

struct cr_err {
    int code;
    char msg[256];
};

/* Fills e (NULL-safe) with code and a printf-style message; returns code. */
int cr_err_set(struct cr_err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Static text for a CR_E* code (or "unknown error"). Never NULL. */
const char *cr_strerror(int code);

#endif
