/* err.c -- error codes and context. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>

int cr_err_set(struct cr_err *e, int code, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        e->code = code;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}

const char *cr_strerror(int code)
{
    switch (code) {
    case CR_OK:
        return "success";
#define CR__X(name, val, text)                                                           \
    case val:                                                                            \
        return text;
        CR_ERRNO_MAP(CR__X)
#undef CR__X
    }
    return "unknown error";
}
