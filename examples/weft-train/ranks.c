/* examples/weft-train/ranks.c: joining weft-run's ranks for --strategy, gathering a
 * pipeline's weights to rank 0, and --strategy mirrored's devices (ranks.h). Public API
 * only. */
#include "ranks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wt_ranks_env_rank(void)
{
    wf_comm_opts co = { .rank = 0, .size = 1 };
    int rc = wf_dist_opts_from_env(&co);
    return rc < 0 ? rc : co.rank;
}

int wt_ranks_comm(wf_runtime *rt, wf_comm **comm, char *err, size_t errlen)
{
    wf_comm_opts co = { .rank = 0, .size = 1 };
    int rc = wf_dist_opts_from_env(&co);
    *comm = NULL;
    if (rc < 0) {
        snprintf(err, errlen, "--strategy: %s", wf_last_errmsg());
        return rc;
    }
    if ((rc = wf_comm_create(rt, &co, comm)) < 0) {
        snprintf(err, errlen, "--strategy: joining the ranks: %s", wf_last_errmsg());
        return rc;
    }
    return 0;
}

int wt_ranks_gather(wf_comm *comm, wf_session *s, const wf_graph *g, wt_stage_of_fn stage_of,
                    void *ctx, char *err, size_t errlen)
{
    int rank = wf_comm_rank(comm), rc = 0;
    for (int id = 0; id < wf_graph_node_count(g) && rc == 0; id++) {
        wf_node *n = wf_graph_node(g, id);
        if (strcmp(wf_node_op(n), "variable") != 0)
            continue;
        /* a parameter's optimizer state ("<param>/adamw/m") goes with its parameter */
        char name[256];
        snprintf(name, sizeof name, "%s", wf_node_name(n));
        int owner = stage_of(name, ctx);
        char *slash = strchr(name, '/');
        if (owner == 0 && slash) {
            *slash = 0;
            owner = stage_of(name, ctx);
        }
        if (owner <= 0)
            continue;
        /* Only the owner reads its value: a stage holds its own variables only, and another
         * one asked for a variable would make it (its initial value) just to be overwritten. */
        wf_tensor *v = NULL;
        if (rank == owner && (rc = wf_session_variable(s, n, &v)) < 0) {
            snprintf(err, errlen, "gathering the stages: %s", wf_session_errmsg(s));
            break;
        }
        wf_dtype dt = wf_node_dtype(n);
        wf_shape shape = wf_node_shape(n);
        size_t bytes = (size_t)wf_shape_numel(shape) * wf_dtype_size(dt);
        void *buf = malloc(bytes ? bytes : 1);
        rc = !buf ? WF_ENOMEM : v ? wf_tensor_read(v, dt, buf, bytes) : 0;
        if (rc == 0 && (rc = wf_comm_broadcast(comm, buf, bytes, owner)) < 0)
            snprintf(err, errlen, "gathering the stages: %s from rank %d: %s", wf_node_name(n),
                     owner, wf_last_errmsg());
        if (rc == 0 && rank == 0) {
            wf_tensor *nv = wf_tensor_from(dt, shape, buf);
            if (!nv || (rc = wf_session_assign(s, n, nv)) < 0)
                snprintf(err, errlen, "gathering the stages: %s: %s", wf_node_name(n),
                         nv ? wf_session_errmsg(s) : "out of memory");
            rc = nv ? rc : WF_ENOMEM;
            wf_tensor_release(nv);
        }
        free(buf);
        wf_tensor_release(v);
    }
    return rc;
}

int wt_mirrored(wf_runtime *rt, int devices, int shards, const char *prog, bool quiet,
                wf_strategy **out, char *err, size_t errlen)
{
    int gpus = wf_device_count(rt) - 1;
    bool sim = devices > gpus || gpus < 1;
    int n = devices ? devices : (sim ? 0 : gpus);
    wf_strategy_opts so = { .shards = shards, .n_devices = n, .simulated_devices = sim ? n : 0 };
    int rc = wf_strategy_mirrored(rt, &so, out);
    if (rc < 0) {
        snprintf(err, errlen, "--strategy mirrored: %s%s", wf_last_errmsg(),
                 n ? "" : " (here: --devices N runs N simulated devices)");
        return rc;
    }
    if (!quiet)
        printf("%s: mirrored over %d %s\n", prog, wf_strategy_device_count(*out),
               sim ? "simulated devices (no GPU for each)" : "GPUs");
    return 0;
}
