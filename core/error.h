/* core/error.h: the error vocabulary that every module of weft may use (not installed).
 * Owns: setting the thread-local message behind wf_last_errmsg(), and formatting helpers.
 * Invariant: a message is at most WF_ERRMSG_MAX - 1 bytes; longer ones are cut.
 * Not here: messages kept by objects (graphs, groups): each object owns its own buffer. */
#ifndef WF_CORE_ERROR_H
#define WF_CORE_ERROR_H

#include <weft/base.h>

#include <stdarg.h>

#define WF_ERRMSG_MAX 512

/* Sets this thread's message and returns 'code', so callers can write
 * 'return wf__err(WF_EINVAL, "x is %d", x);'. */
int wf__err(int code, const char *fmt, ...) WF_PRINTF(2, 3);
int wf__verr(int code, const char *fmt, va_list ap);

/* Returns true if 'code' is WF_OK or one of WF_STATUS_MAP's codes. */
int wf__status_known(int code);

/* Clears this thread's message. */
void wf__err_clear(void);

/* Appends ": <strerror(errnum)>" style detail for OS errors: returns WF_ESYS. */
int wf__err_errno(int errnum, const char *what);

#endif /* WF_CORE_ERROR_H */
