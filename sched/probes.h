/* sched/probes.h: USDT probes of the scheduler (provider "weft"; perf names them
 * sdt_weft:<probe> once the library is added with 'perf buildid-cache --add').
 * Owns: the probe points' names and arguments; each is one nop until a tracer attaches.
 *   task_begin(worker, name)      task_end(worker, name, rc)
 *   steal(thief, victim)          park(worker)        unpark(worker, slept_ns)
 *   actor_msg(worker, actor_name) spawn(worker, name)
 *   transfer(peer, bytes, is_recv)  (sched/trace.h: fired by the modules above)
 * Without sys/sdt.h (systemtap-sdt-dev) they compile to nothing. */
#ifndef WF_SCHED_PROBES_H
#define WF_SCHED_PROBES_H

#ifdef WF_HAVE_SDT
#    include <sys/sdt.h>
#    define WF_PROBE1(n, a)       STAP_PROBE1(weft, n, a)
#    define WF_PROBE2(n, a, b)    STAP_PROBE2(weft, n, a, b)
#    define WF_PROBE3(n, a, b, c) STAP_PROBE3(weft, n, a, b, c)
#else
#    define WF_PROBE1(n, a)       ((void)0)
#    define WF_PROBE2(n, a, b)    ((void)0)
#    define WF_PROBE3(n, a, b, c) ((void)0)
#endif

#endif /* WF_SCHED_PROBES_H */
