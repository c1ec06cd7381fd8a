/* core/error.c: status names, messages, the version, and the thread-local error message.
 * Owns: the one thread-local buffer behind wf_last_errmsg() (the only mutable state of core/,
 * allowed by docs/conventions.md, "State").
 * Not here: messages kept by objects; each object formats into its own buffer. */
#include "error.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char errbuf[WF_ERRMSG_MAX];

const char *wf_strerror(int code)
{
    switch (code) {
    case WF_OK:
        return "success";
#define X(name, value, msg) \
    case WF_##name:         \
        return msg;
        WF_STATUS_MAP(X)
#undef X
    }
    return "unknown error";
}

const char *wf_err_name(int code)
{
    switch (code) {
    case WF_OK:
        return "WF_OK";
#define X(name, value, msg) \
    case WF_##name:         \
        return "WF_" #name;
        WF_STATUS_MAP(X)
#undef X
    }
    return "WF_UNKNOWN";
}

int wf__status_known(int code)
{
    return strcmp(wf_err_name(code), "WF_UNKNOWN") != 0;
}

const char *wf_last_errmsg(void)
{
    return errbuf;
}

int wf_version(void)
{
    return WF_VERSION_HEX;
}

int wf__verr(int code, const char *fmt, va_list ap)
{
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    return code;
}

int wf__err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    wf__verr(code, fmt, ap);
    va_end(ap);
    return code;
}

void wf__err_clear(void)
{
    errbuf[0] = '\0';
}

int wf__err_errno(int errnum, const char *what)
{
    char tmp[128];
    /* GNU strerror_r may return a static string instead of filling 'tmp'. */
    const char *s = strerror_r(errnum, tmp, sizeof tmp);
    return wf__err(WF_ESYS, "%s: %s", what, s);
}
