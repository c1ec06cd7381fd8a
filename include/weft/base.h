/* weft/base.h: what every public header of weft needs.
 * Owns: the export and attribute macros, the status codes (one X-macro list from which the
 * enum, wf_strerror() and wf_err_name() are generated), the version, and the thread-local
 * error message.
 * Not here: anything with state; each area's calls live in its own header. */
#ifndef WEFT_BASE_H
#define WEFT_BASE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(WF_STATIC_DEFINE)
#    define WF_API
#elif defined(__GNUC__)
#    define WF_API __attribute__((visibility("default")))
#else
#    define WF_API
#endif

#if defined(__GNUC__)
#    define WF_NODISCARD         __attribute__((warn_unused_result))
#    define WF_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#    define WF_NODISCARD
#    define WF_PRINTF(fmt, args)
#endif

#define WF_VERSION_MAJOR 0
#define WF_VERSION_MINOR 1
#define WF_VERSION_PATCH 0
#define WF_VERSION_HEX   ((WF_VERSION_MAJOR << 16) | (WF_VERSION_MINOR << 8) | WF_VERSION_PATCH)

/* The status codes: X(name, value, message). Append only; never renumber. */
#define WF_STATUS_MAP(X)                                        \
    X(EINVAL, -1, "invalid argument")                           \
    X(ENOMEM, -2, "out of memory")                              \
    X(ESHAPE, -3, "tensor shapes do not match")                 \
    X(ENODEV, -4, "no device can run this")                     \
    X(EDEVICE, -5, "device or driver error")                    \
    X(ECANCELED, -6, "canceled because an earlier task failed") \
    X(ETIMEDOUT, -7, "timed out")                               \
    X(EBUSY, -8, "resource busy")                               \
    X(ESYS, -9, "operating system error")                       \
    X(ETOPO, -10, "topology error")                             \
    X(EDTYPE, -11, "tensor dtypes do not match")                \
    X(ENOTFOUND, -12, "not found")                              \
    X(EIO, -13, "input/output error")                           \
    X(EFORMAT, -14, "malformed data")                           \
    X(EPEER, -15, "a peer failed or broke the protocol")        \
    X(ENOSYS, -16, "not supported in this build")               \
    X(ETASK, -17, "a task failed (its code was positive or unknown)")

typedef enum wf_status {
    WF_OK = 0,

#define WF__STATUS_ENUM(name, value, msg) WF_##name = (value),
    WF_STATUS_MAP(WF__STATUS_ENUM)
#undef WF__STATUS_ENUM
} wf_status;

/* Returns a static, human-readable sentence for a status code ("invalid argument"); an
 * unknown code gives "unknown error". Ownership: the string is static.
 * Threads: safe from any thread. */
WF_API const char *wf_strerror(int code);

/* Returns the code's name ("WF_EINVAL", "WF_OK"), or "WF_UNKNOWN".
 * Ownership: static. Threads: safe from any thread. */
WF_API const char *wf_err_name(int code);

/* Returns the detail of the last error raised on this thread by a call that keeps no
 * object of its own (runtime-wide calls): e.g. "wf_runtime_create: n_workers is 100000,
 * above the limit 1024". "" when none.
 * Ownership: borrowed; valid until the next weft call on this thread.
 * Threads: thread-local. */
WF_API const char *wf_last_errmsg(void);

/* Returns WF_VERSION_HEX of the library that is linked (not of the headers compiled). */
WF_API int wf_version(void);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_BASE_H */
