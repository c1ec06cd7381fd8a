/* tools/run_link.c: the link between the launchers of a multi-node job (see run_link.h).
 * Owns: node 0's listening socket and one connection per other node (node 0), or the one
 * connection to node 0 (other nodes); each connection's line buffer and hello deadline.
 * Invariant: a connection is either pending (accepted, no valid hello yet: its timer runs)
 * or joined (in 'conns[node]'); 'handles' counts the libuv handles not yet closed, and the
 * link is freed when it reaches 0 after run_link_close().
 * Not here: what the lines mean (tools/weft-run.c). */
#include "run_link.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINE_MAX_BYTES   512
#define HELLO_TIMEOUT_MS 5000
#define MAX_PENDING      16

typedef struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer; /* pending: the hello deadline; node k: the connect retry */
    struct run_link *l;
    int node; /* -1 while pending */
    int nh;   /* of tcp and timer, the handles not yet closed */
    bool open;
    char buf[LINE_MAX_BYTES];
    size_t len;
} conn;

struct run_link {
    uv_loop_t *loop;
    run_link_cbs cbs;
    int nnodes, node_rank, joined, handles;
    char token[256];
    bool closing, ready_sent;
    uv_tcp_t server;
    conn **conns; /* [nnodes]: node 0's joined connections; [0]: node k's to node 0 */
    conn *pending[MAX_PENDING];
    struct sockaddr_storage sa;
    uint64_t deadline_ms; /* node k: stop retrying the connect past it */
};

static void handle_closed(uv_handle_t *h)
{
    run_link *l = h->data ? ((conn *)h->data)->l : NULL;
    if (!l)
        l = (run_link *)((char *)h - offsetof(run_link, server));
    if (--l->handles == 0 && l->closing) {
        free(l->conns);
        free(l);
    }
}

static void conn_closed(uv_handle_t *h)
{
    conn *c = h->data;
    run_link *l = c->l;
    if (--c->nh > 0)
        return; /* libuv closes in no set order: the second close frees 'c' */
    free(c);
    if (--l->handles == 0 && l->closing) {
        free(l->conns);
        free(l);
    }
}

/* Closes 'c' (both its handles); 'why' non-NULL: tell the owner that the link is lost. */
static void conn_drop(conn *c, const char *why)
{
    if (!c->open)
        return;
    c->open = false;
    run_link *l = c->l;
    for (int i = 0; i < MAX_PENDING; i++)
        if (l->pending[i] == c)
            l->pending[i] = NULL;
    int node = c->node;
    if (node >= 0 && l->conns[l->node_rank ? 0 : node] == c)
        l->conns[l->node_rank ? 0 : node] = NULL;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, conn_closed);
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
    if (why && node >= 0 && !l->closing && l->cbs.lost)
        l->cbs.lost(l->cbs.arg, node, why);
}

static conn *conn_new(run_link *l)
{
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->l = l;
    c->node = -1;
    uv_tcp_init(l->loop, &c->tcp);
    uv_timer_init(l->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->nh = 2;
    c->open = true;
    l->handles++; /* one count for the pair: conn_closed frees 'c' when both have closed */
    return c;
}

static void on_write(uv_write_t *w, int status)
{
    (void)status; /* a failed write shows as a read error on the same connection */
    free(w);
}

static void conn_write(conn *c, const char *line)
{
    if (!c || !c->open)
        return;
    size_t n = strlen(line);
    uv_write_t *w = malloc(sizeof *w + n + 1);
    if (!w)
        return;
    char *p = (char *)(w + 1);
    memcpy(p, line, n);
    p[n] = '\n';
    uv_buf_t b = uv_buf_init(p, (unsigned)n + 1);
    if (uv_write(w, (uv_stream_t *)&c->tcp, &b, 1, on_write) != 0)
        free(w);
}

/* Node 0: a pending connection's first line must be "hello <node> <token>". */
static void take_hello(conn *c, const char *line)
{
    run_link *l = c->l;
    int node = -1, used = 0;
    if (sscanf(line, "hello %d %n", &node, &used) < 1 || used == 0 || node < 1 ||
        node >= l->nnodes || strcmp(line + used, l->token) != 0 || l->conns[node]) {
        fprintf(stderr, "weft-run: a launcher link was refused: %s\n",
                node >= 1 && node < l->nnodes && l->conns[node] ? "node already joined"
                                                                : "bad hello or token");
        conn_drop(c, NULL);
        return;
    }
    for (int i = 0; i < MAX_PENDING; i++)
        if (l->pending[i] == c)
            l->pending[i] = NULL;
    uv_timer_stop(&c->timer);
    c->node = node;
    l->conns[node] = c;
    if (++l->joined == l->nnodes - 1 && !l->ready_sent) {
        l->ready_sent = true;
        if (l->cbs.ready)
            l->cbs.ready(l->cbs.arg);
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    conn *c = h->data;
    (void)suggested;
    *b = uv_buf_init(c->buf + c->len, (unsigned)(sizeof c->buf - c->len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    conn *c = s->data;
    (void)b;
    if (n < 0) {
        conn_drop(c, n == UV_EOF ? "connection closed" : uv_strerror((int)n));
        return;
    }
    c->len += (size_t)n;
    size_t start = 0;
    for (size_t i = 0; i < c->len && c->open; i++) {
        if (c->buf[i] != '\n')
            continue;
        c->buf[i] = 0;
        const char *line = c->buf + start;
        start = i + 1;
        if (c->node < 0)
            take_hello(c, line);
        else if (c->l->cbs.line && !c->l->closing)
            c->l->cbs.line(c->l->cbs.arg, c->node, line);
    }
    if (!c->open)
        return;
    memmove(c->buf, c->buf + start, c->len - start);
    c->len -= start;
    if (c->len == sizeof c->buf) /* a line longer than any we send */
        conn_drop(c, "line too long");
}

static void on_hello_timeout(uv_timer_t *t)
{
    conn_drop(t->data, NULL);
}

static void on_accept(uv_stream_t *server, int status)
{
    run_link *l = (run_link *)((char *)server - offsetof(run_link, server));
    if (status < 0)
        return;
    int slot = -1;
    for (int i = 0; i < MAX_PENDING && slot < 0; i++)
        if (!l->pending[i])
            slot = i;
    conn *c = conn_new(l);
    if (!c)
        return;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 || slot < 0) {
        conn_drop(c, NULL); /* strangers beyond MAX_PENDING are closed at once */
        return;
    }
    l->pending[slot] = c;
    uv_timer_start(&c->timer, on_hello_timeout, HELLO_TIMEOUT_MS, 0);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void try_connect(run_link *l);

static void on_retry(uv_timer_t *t)
{
    conn *c = t->data;
    run_link *l = c->l;
    conn_drop(c, NULL);
    try_connect(l);
}

static void on_connect(uv_connect_t *req, int status)
{
    conn *c = req->data;
    free(req);
    if (!c->open)
        return;
    run_link *l = c->l;
    if (status < 0) {
        if (uv_now(l->loop) >= l->deadline_ms) {
            fprintf(stderr, "weft-run: node %d cannot reach node 0's launcher: %s\n", l->node_rank,
                    uv_strerror(status));
            conn_drop(c, "cannot connect");
            return;
        }
        uv_timer_start(&c->timer, on_retry, 100, 0);
        return;
    }
    char hello[LINE_MAX_BYTES];
    snprintf(hello, sizeof hello, "hello %d %s", l->node_rank, l->token);
    conn_write(c, hello);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void try_connect(run_link *l)
{
    if (l->closing)
        return;
    conn *c = conn_new(l);
    uv_connect_t *req = malloc(sizeof *req);
    if (!c || !req) {
        free(req);
        if (c) {
            c->node = 0;
            l->conns[0] = c;
            conn_drop(c, "out of memory");
        }
        return;
    }
    req->data = c;
    c->node = 0; /* in 'conns[0]' from now on, so that run_link_close() finds it */
    l->conns[0] = c;
    if (uv_tcp_connect(req, &c->tcp, (const struct sockaddr *)&l->sa, on_connect) != 0) {
        free(req);
        uv_timer_start(&c->timer, on_retry, 100, 0);
    }
}

int run_link_start(uv_loop_t *loop, const char *host, int port, int nnodes, int node_rank,
                   const char *token, unsigned timeout_ms, const run_link_cbs *cbs, run_link **out)
{
    *out = NULL;
    if (strlen(token) >= sizeof((run_link *)0)->token || strpbrk(token, "\n ")) {
        fprintf(stderr, "weft-run: --token must be under 256 bytes, without spaces\n");
        return -1;
    }
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai = NULL;
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc != 0 || !ai) {
        fprintf(stderr, "weft-run: cannot resolve '%s': %s\n", host, gai_strerror(rc));
        return -1;
    }
    run_link *l = calloc(1, sizeof *l);
    if (l)
        l->conns = calloc((size_t)nnodes, sizeof *l->conns);
    if (!l || !l->conns) {
        freeaddrinfo(ai);
        free(l);
        fprintf(stderr, "weft-run: out of memory\n");
        return -1;
    }
    memcpy(&l->sa, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    l->loop = loop;
    l->cbs = *cbs;
    l->nnodes = nnodes;
    l->node_rank = node_rank;
    snprintf(l->token, sizeof l->token, "%s", token);
    if (node_rank == 0) {
        uv_tcp_init(loop, &l->server);
        l->server.data = NULL;
        l->handles++;
        if ((rc = uv_tcp_bind(&l->server, (const struct sockaddr *)&l->sa, 0)) != 0 ||
            (rc = uv_listen((uv_stream_t *)&l->server, 64, on_accept)) != 0) {
            fprintf(stderr, "weft-run: node 0 cannot listen on %s:%d: %s\n", host, port,
                    uv_strerror(rc));
            run_link_close(l);
            return -1;
        }
    } else {
        l->deadline_ms = uv_now(loop) + timeout_ms;
        try_connect(l);
    }
    *out = l;
    return 0;
}

void run_link_send(run_link *l, int node, const char *line)
{
    if (!l || l->closing)
        return;
    if (l->node_rank != 0) {
        conn_write(l->conns[0], line);
        return;
    }
    for (int k = 1; k < l->nnodes; k++)
        if (node < 0 || node == k)
            conn_write(l->conns[k], line);
}

void run_link_close(run_link *l)
{
    if (!l || l->closing)
        return;
    l->closing = true;
    for (int i = 0; i < MAX_PENDING; i++)
        if (l->pending[i])
            conn_drop(l->pending[i], NULL);
    for (int k = 0; k < l->nnodes; k++)
        if (l->conns[k])
            conn_drop(l->conns[k], NULL);
    if (l->node_rank == 0)
        uv_close((uv_handle_t *)&l->server, handle_closed);
    if (l->handles == 0) {
        free(l->conns);
        free(l);
    }
}
