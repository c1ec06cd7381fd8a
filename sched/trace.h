/* sched/trace.h: what the modules above sched/ record on the scheduler's trace and probes (a
 * module interface: not installed, not internal.h).
 * Owns: the transfer event (a span of a network or device transfer, from its post to its
 *   completion) and its USDT probe 'transfer(peer, bytes, is_recv)' (provider "weft",
 *   sched/probes.h), so transfers appear on the same Perfetto trace as the tasks and actor
 *   turns that caused them (docs/architecture.md), and a tracer sees them without a trace.
 * Not here: the rings and the writer (trace.c), deciding what to record (callers). */
#ifndef WF_SCHED_TRACE_H
#define WF_SCHED_TRACE_H

#include <weft/sched.h>

#include <stddef.h>
#include <stdint.h>

/* The clock of trace events (CLOCK_MONOTONIC, nanoseconds): a transfer's 't0'. */
uint64_t wf__trace_clock(void);

/* Records transfer 'name' (copied, cut at 23 bytes) of 'bytes' with rank 'peer' that began at
 * 't0' (wf__trace_clock()) and ends now, on the calling worker's ring when it is a worker of
 * 'rt' and tracing is on, and fires the probe in any case. Threads: any. */
void wf__trace_transfer(wf_runtime *rt, const char *name, uint64_t t0, int peer, size_t bytes,
                        int is_recv);

#endif /* WF_SCHED_TRACE_H */
