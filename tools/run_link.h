/* tools/run_link.h: the link between the launchers of a multi-node job (weft-run --nnodes):
 * node 0's launcher listens on the master's port + 1, every other node's launcher connects
 * to it and presents its node rank and the job's token; then they exchange text lines
 * ("start 2 ...", "stop", "down 0", "exit 1"), whose meaning is weft-run.c's.
 * Owns: the listening socket, the connections, their line buffers.
 * Not here: what the lines mean (tools/weft-run.c). Built on libuv, in weft-run's loop. */
#ifndef WEFT_TOOLS_RUN_LINK_H
#define WEFT_TOOLS_RUN_LINK_H

#include <uv.h>

#include <stdbool.h>

typedef struct run_link run_link;

typedef struct run_link_cbs {
    void *arg;
    /* Node 0: every other node has joined. */
    void (*ready)(void *arg);
    /* A line from 'node' (node 0: the peer's node rank; other nodes: 0), without its '\n'. */
    void (*line)(void *arg, int node, const char *line);
    /* The link to 'node' closed or failed ('why': the reason in words). */
    void (*lost)(void *arg, int node, const char *why);
} run_link_cbs;

/* Node 0: listens on 'host':'port' for the 'nnodes' - 1 other launchers; a connection that
 * does not present "hello <node> <token>" with a node rank not yet seen within 5 s is
 * closed. Node 'node_rank' > 0: connects to 'host':'port' (retrying for 'timeout_ms') and
 * says hello. Returns 0, or -1 with the reason printed on stderr. */
int run_link_start(uv_loop_t *loop, const char *host, int port, int nnodes, int node_rank,
                   const char *token, unsigned timeout_ms, const run_link_cbs *cbs, run_link **out);

/* Sends 'line' (a '\n' is added) to 'node' (node 0 only; -1: to every node) or, on another
 * node, to node 0. Lines to a node whose link is lost are dropped. */
void run_link_send(run_link *l, int node, const char *line);

/* Closes every handle of the link (no callback runs afterwards) and frees it once the loop
 * has closed them. NULL is a no-op. */
void run_link_close(run_link *l);

#endif /* WEFT_TOOLS_RUN_LINK_H */
