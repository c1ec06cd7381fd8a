/* placement/schedule.c: pipeline schedules (GPipe, 1F1B), their static check and their
 *   simulation.
 * Owns: wf_pipe_schedule_*, wf_pipe_check(), wf_pipe_simulate() (weft/placement.h).
 * How a schedule is made: each stage's compute order comes from the schedule (GPipe: every
 *   forward, then every backward; 1F1B, PipeDream-Flush: stage k runs min(p - k - 1, m)
 *   forwards, then alternates one forward and one backward, then the remaining backwards);
 *   backwards run in micro-batch order in both, so both accumulate gradients in the same
 *   order. A list scheduler then builds one global order in rounds: each stage in turn
 *   takes its next compute action if the message it needs has been sent, preceded by that
 *   receive and followed by its send. Each stage's list is the projection of the global
 *   order, so every stage agrees on it by construction, and wf_pipe_check() proves it.
 * The check's model: a receive is posted before the step starts (pre-posted) and completes
 *   once its send has been made; a send never waits. So an action waits for the action
 *   before it on its stage, and a receive also for its send; a run finishes iff this
 *   wait-for graph is acyclic (Kahn's algorithm) and every receive has its send.
 * Not here: where the stages come from (stages.c), running the actions (runtime/). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_STAGES  1024
#define MAX_MICRO   65536
#define MAX_ACTIONS (1 << 22)

struct wf_pipe_schedule {
    int P, m, kind;
    int *len;              /* by stage */
    wf_pipe_action **list; /* by stage */
    int n_global;
    int *global_stage; /* the global order: stage and index into its list */
    int *global_index;
};

static const char *op_name(int op)
{
    static const char *const names[] = { "forward",         "backward",      "send-activation",
                                         "recv-activation", "send-gradient", "recv-gradient" };
    return op >= 0 && op <= WF_PIPE_RECV_GRAD ? names[op] : "?";
}

void wf_pipe_schedule_destroy(wf_pipe_schedule *s)
{
    if (!s)
        return;
    for (int k = 0; s->list && k < s->P; k++)
        free(s->list[k]);
    free(s->list);
    free(s->len);
    free(s->global_stage);
    free(s->global_index);
    free(s);
}

/* Stage k's compute order: 2m entries, micro-batch mb as mb (forward) or -1 - mb (backward). */
static void compute_order(int kind, int P, int m, int k, int *ord)
{
    int n = 0;
    if (kind == WF_SCHEDULE_GPIPE) {
        for (int i = 0; i < m; i++)
            ord[n++] = i;
        for (int i = 0; i < m; i++)
            ord[n++] = -1 - i;
        return;
    }
    int w = P - k - 1 < m ? P - k - 1 : m;
    for (int i = 0; i < w; i++)
        ord[n++] = i;
    for (int i = 0; i < m - w; i++) {
        ord[n++] = w + i;
        ord[n++] = -1 - i;
    }
    for (int i = m - w; i < m; i++)
        ord[n++] = -1 - i;
}

static void push(wf_pipe_schedule *s, int k, int op, int mb, int peer)
{
    wf_pipe_action a = { op, mb, peer };
    s->global_stage[s->n_global] = k;
    s->global_index[s->n_global++] = s->len[k];
    s->list[k][s->len[k]++] = a;
}

int wf_pipe_schedule_create(int schedule, int stages, int micro_batches, wf_pipe_schedule **out)
{
    if (!out)
        return wf__err(WF_EINVAL, "wf_pipe_schedule_create: NULL out");
    *out = NULL;
    if (schedule != WF_SCHEDULE_GPIPE && schedule != WF_SCHEDULE_1F1B)
        return wf__err(WF_EINVAL, "pipeline schedule %d: WF_SCHEDULE_GPIPE or WF_SCHEDULE_1F1B",
                       schedule);
    if (stages < 1 || stages > MAX_STAGES)
        return wf__err(WF_EINVAL, "pipeline: stages %d is not in 1 .. %d", stages, MAX_STAGES);
    if (micro_batches < 1 || micro_batches > MAX_MICRO)
        return wf__err(WF_EINVAL,
                       "pipeline: micro_batches %d is not in 1 .. %d (every schedule "
                       "needs at least one)",
                       micro_batches, MAX_MICRO);
    if ((long long)stages * micro_batches * 6 > MAX_ACTIONS)
        return wf__err(WF_EINVAL, "pipeline: %d stages x %d micro_batches: more than %d actions",
                       stages, micro_batches, MAX_ACTIONS);
    int P = stages, m = micro_batches;
    wf_pipe_schedule *s = calloc(1, sizeof *s);
    int *ord = malloc(sizeof *ord * (size_t)P * 2 * (size_t)m);
    int *next = calloc((size_t)P, sizeof *next);
    /* done_f[k * m + mb]: stage k's forward of mb is in the global order (likewise done_b) */
    unsigned char *done_f = calloc((size_t)P * m, 1), *done_b = calloc((size_t)P * m, 1);
    int rc = 0;
    if (!s || !ord || !next || !done_f || !done_b || !(s->len = calloc((size_t)P, sizeof(int))) ||
        !(s->list = calloc((size_t)P, sizeof *s->list)) ||
        !(s->global_stage = malloc(sizeof(int) * (size_t)P * 6 * m)) ||
        !(s->global_index = malloc(sizeof(int) * (size_t)P * 6 * m))) {
        rc = wf__err(WF_ENOMEM, "pipeline schedule: no memory");
        goto out;
    }
    s->P = P;
    s->m = m;
    s->kind = schedule;
    for (int k = 0; k < P; k++) {
        if (!(s->list[k] = malloc(sizeof(wf_pipe_action) * 6 * (size_t)m))) {
            rc = wf__err(WF_ENOMEM, "pipeline schedule: no memory");
            goto out;
        }
        compute_order(schedule, P, m, k, ord + (size_t)k * 2 * m);
    }
    for (int left = 2 * P * m; left > 0;) {
        int progress = 0;
        for (int k = 0; k < P; k++) {
            if (next[k] == 2 * m)
                continue;
            int e = ord[(size_t)k * 2 * m + next[k]];
            bool fwd = e >= 0;
            int mb = fwd ? e : -1 - e;
            if (fwd && k > 0 && !done_f[(size_t)(k - 1) * m + mb])
                continue;
            if (!fwd && k < P - 1 && !done_b[(size_t)(k + 1) * m + mb])
                continue;
            if (fwd) {
                if (k > 0)
                    push(s, k, WF_PIPE_RECV_ACT, mb, k - 1);
                push(s, k, WF_PIPE_FWD, mb, -1);
                if (k < P - 1)
                    push(s, k, WF_PIPE_SEND_ACT, mb, k + 1);
                done_f[(size_t)k * m + mb] = 1;
            } else {
                if (k < P - 1)
                    push(s, k, WF_PIPE_RECV_GRAD, mb, k + 1);
                push(s, k, WF_PIPE_BWD, mb, -1);
                if (k > 0)
                    push(s, k, WF_PIPE_SEND_GRAD, mb, k - 1);
                done_b[(size_t)k * m + mb] = 1;
            }
            next[k]++;
            left--;
            progress = 1;
        }
        if (!progress) { /* cannot happen for the orders above; refuse rather than spin */
            rc = wf__err(WF_EINVAL, "pipeline schedule: no stage can go on (internal)");
            goto out;
        }
    }
out:
    free(ord);
    free(next);
    free(done_f);
    free(done_b);
    if (rc < 0) {
        wf_pipe_schedule_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

int wf_pipe_schedule_stages(const wf_pipe_schedule *s)
{
    return s ? s->P : 0;
}

int wf_pipe_schedule_micro_batches(const wf_pipe_schedule *s)
{
    return s ? s->m : 0;
}

const wf_pipe_action *wf_pipe_schedule_actions(const wf_pipe_schedule *s, int stage, int *n)
{
    if (!s || stage < 0 || stage >= s->P) {
        if (n)
            *n = 0;
        return NULL;
    }
    if (n)
        *n = s->len[stage];
    return s->list[stage];
}

/* ---- The check ----------------------------------------------------------------------------- */

/* The message slot of a transfer: (kind, micro-batch, sending stage); kind 0 activations
 * (k -> k+1), 1 gradients (k -> k-1). */
static size_t slot(int kind, int mb, int from, int m)
{
    return ((size_t)from * 2 + (size_t)kind) * (size_t)m + (size_t)mb;
}

static int bad(int k, int i, const wf_pipe_action *a, const char *why)
{
    return wf__err(WF_EINVAL,
                   "pipeline check: stage %d, action %d (%s of micro-batch %d%s%d): "
                   "%s",
                   k, i, op_name(a->op), a->micro_batch, a->peer >= 0 ? ", peer " : "",
                   a->peer >= 0 ? a->peer : 0, why);
}

int wf_pipe_check(int stages, int micro_batches, const wf_pipe_action *const *lists,
                  const int *lens, int *max_in_flight)
{
    if (stages < 1 || stages > MAX_STAGES || micro_batches < 1 || micro_batches > MAX_MICRO ||
        !lists || !lens)
        return wf__err(WF_EINVAL, "pipeline check: %d stages, %d micro_batches or NULL lists",
                       stages, micro_batches);
    int P = stages, m = micro_batches, rc = 0, worst = 0;
    size_t total = 0;
    for (int k = 0; k < P; k++) {
        if (lens[k] < 0 || (lens[k] > 0 && !lists[k]) || lens[k] > MAX_ACTIONS)
            return wf__err(WF_EINVAL, "pipeline check: stage %d: bad list (length %d)", k, lens[k]);
        total += (size_t)lens[k];
    }
    size_t nslot = (size_t)P * 2 * m;
    size_t *base = malloc(sizeof *base * (size_t)(P + 1));
    long *send_at = malloc(sizeof *send_at * nslot); /* global action id of the send, or -1 */
    long *recv_at = malloc(sizeof *recv_at * nslot);
    long *wait = malloc(sizeof *wait * (total + 1)); /* a receive's send, or -1 */
    int *indeg = malloc(sizeof *indeg * (total + 1));
    unsigned char *state = calloc((size_t)P * m, 1); /* bit 0 forward done, 1 backward done,
                                                        2 activations received, 3 gradients */
    long *queue = malloc(sizeof *queue * (total + 1));
    if (!base || !send_at || !recv_at || !wait || !indeg || !state || !queue) {
        rc = wf__err(WF_ENOMEM, "pipeline check: no memory");
        goto out;
    }
    for (size_t q = 0; q < nslot; q++)
        send_at[q] = recv_at[q] = -1;
    base[0] = 0;
    for (int k = 0; k < P; k++)
        base[k + 1] = base[k] + (size_t)lens[k];
    /* Per stage: each action valid, in an order its stage can run. */
    for (int k = 0; k < P && rc == 0; k++) {
        int alive = 0;
        for (int i = 0; i < lens[k] && rc == 0; i++) {
            const wf_pipe_action *a = &lists[k][i];
            unsigned char *st =
                &state[(size_t)k * m +
                       (a->micro_batch >= 0 && a->micro_batch < m ? a->micro_batch : 0)];
            long id = (long)(base[k] + (size_t)i);
            if (a->op < WF_PIPE_FWD || a->op > WF_PIPE_RECV_GRAD) {
                rc = bad(k, i, a, "unknown op");
                break;
            }
            if (a->micro_batch < 0 || a->micro_batch >= m) {
                rc = bad(k, i, a, "micro-batch out of range");
                break;
            }
            int want = a->op == WF_PIPE_SEND_ACT || a->op == WF_PIPE_RECV_GRAD   ? k + 1
                       : a->op == WF_PIPE_RECV_ACT || a->op == WF_PIPE_SEND_GRAD ? k - 1
                                                                                 : -1;
            bool comm = a->op >= WF_PIPE_SEND_ACT;
            if (comm && (want < 0 || want >= P)) {
                rc = bad(k, i, a, "this stage has no such neighbour");
                break;
            }
            if (a->peer != want) {
                rc = bad(k, i, a,
                         comm ? "the peer is not the neighbour" : "a compute action names a peer");
                break;
            }
            wait[id] = -1;
            switch (a->op) {
            case WF_PIPE_FWD:
                if (*st & 1)
                    rc = bad(k, i, a, "a second forward");
                else if (k > 0 && !(*st & 4))
                    rc = bad(k, i, a, "runs before its activations are received");
                *st |= 1;
                if (++alive > worst)
                    worst = alive;
                break;
            case WF_PIPE_BWD:
                if (*st & 2)
                    rc = bad(k, i, a, "a second backward");
                else if (!(*st & 1))
                    rc = bad(k, i, a, "runs before its forward");
                else if (k < P - 1 && !(*st & 8))
                    rc = bad(k, i, a, "runs before its gradient is received");
                *st |= 2;
                alive--;
                break;
            case WF_PIPE_SEND_ACT:
            case WF_PIPE_SEND_GRAD: {
                bool act = a->op == WF_PIPE_SEND_ACT;
                size_t q = slot(act ? 0 : 1, a->micro_batch, k, m);
                if (!(*st & (act ? 1 : 2)))
                    rc = bad(k, i, a,
                             act ? "sends before its forward"
                                 : "sends before its "
                                   "backward");
                else if (send_at[q] >= 0)
                    rc = bad(k, i, a, "a second send of the same message");
                send_at[q] = id;
                break;
            }
            default: { /* receives */
                bool act = a->op == WF_PIPE_RECV_ACT;
                size_t q = slot(act ? 0 : 1, a->micro_batch, a->peer, m);
                if (recv_at[q] >= 0)
                    rc = bad(k, i, a, "a second receive of the same message");
                recv_at[q] = id;
                *st |= act ? 4 : 8;
                break;
            }
            }
        }
        for (int mb = 0; mb < m && rc == 0; mb++)
            if ((state[(size_t)k * m + mb] & 3) != 3)
                rc = wf__err(WF_EINVAL,
                             "pipeline check: stage %d never runs the %s of "
                             "micro-batch %d",
                             k, state[(size_t)k * m + mb] & 1 ? "backward" : "forward", mb);
    }
    /* Every send has its receive and every receive its send. */
    for (size_t q = 0; q < nslot && rc == 0; q++) {
        if ((send_at[q] < 0) == (recv_at[q] < 0)) {
            if (recv_at[q] >= 0)
                wait[recv_at[q]] = send_at[q];
            continue;
        }
        long id = send_at[q] >= 0 ? send_at[q] : recv_at[q];
        int k = 0;
        while (base[k + 1] <= (size_t)id)
            k++;
        int i = (int)((size_t)id - base[k]);
        rc =
            bad(k, i, &lists[k][i], send_at[q] >= 0 ? "no stage receives it" : "no stage sends it");
    }
    if (rc < 0)
        goto out;
    /* The wait-for graph: an action waits for its stage's previous action and a receive for
     * its send. Kahn's algorithm; out-edges are recomputed (the next action on the stage, and
     * for a send its receive). */
    for (size_t id = 0; id < total; id++)
        indeg[id] = 0;
    for (int k = 0; k < P; k++)
        for (int i = 0; i < lens[k]; i++) {
            long id = (long)(base[k] + (size_t)i);
            indeg[id] = (i > 0) + (wait[id] >= 0);
        }
    size_t head = 0, tail = 0, seen = 0;
    for (size_t id = 0; id < total; id++)
        if (indeg[id] == 0)
            queue[tail++] = (long)id;
    while (head < tail) {
        long id = queue[head++];
        seen++;
        int k = 0;
        while (base[k + 1] <= (size_t)id)
            k++;
        int i = (int)((size_t)id - base[k]);
        if (i + 1 < lens[k] && --indeg[id + 1] == 0)
            queue[tail++] = id + 1;
        const wf_pipe_action *a = &lists[k][i];
        if (a->op == WF_PIPE_SEND_ACT || a->op == WF_PIPE_SEND_GRAD) {
            long r = recv_at[slot(a->op == WF_PIPE_SEND_ACT ? 0 : 1, a->micro_batch, k, m)];
            if (--indeg[r] == 0)
                queue[tail++] = r;
        }
    }
    if (seen < total) {
        /* A stuck action: the first action of some stage that never ran. Follow what it
         * waits for until an action repeats: that is on a cycle. */
        char buf[WF_ERRMSG_MAX];
        int len = 0;
        long id = -1;
        for (int k = 0; k < P && id < 0; k++)
            for (int i = 0; i < lens[k]; i++)
                if (indeg[base[k] + (size_t)i] > 0) {
                    id = (long)(base[k] + (size_t)i);
                    break;
                }
        for (int steps = 0; steps < 8 && id >= 0 && len < (int)sizeof buf - 80; steps++) {
            int k = 0;
            while (base[k + 1] <= (size_t)id)
                k++;
            int i = (int)((size_t)id - base[k]);
            const wf_pipe_action *a = &lists[k][i];
            len += snprintf(buf + len, sizeof buf - (size_t)len, "%sstage %d action %d (%s %d)",
                            steps ? " waits for " : "", k, i, op_name(a->op), a->micro_batch);
            /* what it waits for that has not run: its receive's send, else the one before */
            if (wait[id] >= 0 && indeg[wait[id]] > 0)
                id = wait[id];
            else if (i > 0)
                id = id - 1;
            else
                id = -1;
        }
        rc = wf__err(WF_EINVAL, "pipeline check: a wait cycle, %zu of %zu actions never run: %s",
                     total - seen, total, buf);
    }
out:
    if (rc == 0 && max_in_flight)
        *max_in_flight = worst;
    free(base);
    free(send_at);
    free(recv_at);
    free(wait);
    free(indeg);
    free(state);
    free(queue);
    return rc;
}

/* ---- The simulation ------------------------------------------------------------------------ */

int wf_pipe_simulate(const wf_pipe_schedule *s, const double *fwd_s, const double *bwd_s,
                     const double *xfer_s, double *step_s, double *bubble)
{
    if (!s || !fwd_s || !bwd_s || !step_s || !bubble)
        return wf__err(WF_EINVAL, "wf_pipe_simulate: NULL argument");
    int P = s->P, m = s->m;
    double *clock = calloc((size_t)P, sizeof *clock), *busy = calloc((size_t)P, sizeof *busy);
    double *arrive = malloc(sizeof *arrive * (size_t)P * 2 * m);
    if (!clock || !busy || !arrive) {
        free(clock);
        free(busy);
        free(arrive);
        return wf__err(WF_ENOMEM, "wf_pipe_simulate: no memory");
    }
    /* The global order is topological: a receive comes after its send. */
    for (int g = 0; g < s->n_global; g++) {
        int k = s->global_stage[g];
        const wf_pipe_action *a = &s->list[k][s->global_index[g]];
        switch (a->op) {
        case WF_PIPE_FWD:
            clock[k] += fwd_s[k];
            busy[k] += fwd_s[k];
            break;
        case WF_PIPE_BWD:
            clock[k] += bwd_s[k];
            busy[k] += bwd_s[k];
            break;
        case WF_PIPE_SEND_ACT:
        case WF_PIPE_SEND_GRAD: {
            int link = k < a->peer ? k : a->peer;
            arrive[slot(a->op == WF_PIPE_SEND_ACT ? 0 : 1, a->micro_batch, k, m)] =
                clock[k] + (xfer_s ? xfer_s[link] : 0);
            break;
        }
        default: {
            double t = arrive[slot(a->op == WF_PIPE_RECV_ACT ? 0 : 1, a->micro_batch, a->peer, m)];
            if (t > clock[k])
                clock[k] = t;
        }
        }
    }
    double step = 0, work = 0;
    for (int k = 0; k < P; k++) {
        if (clock[k] > step)
            step = clock[k];
        work += busy[k];
    }
    *step_s = step;
    *bubble = step > 0 ? 1 - work / (P * step) : 0;
    free(clock);
    free(busy);
    free(arrive);
    return 0;
}
