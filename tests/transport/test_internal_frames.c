/* tests/transport/test_internal_frames.c: the control-plane frame codec refuses malformed,
 * oversized, wrong-version and wrong-token input with errors and never crashes (bytes fed
 * to the parser directly, then random bytes); and a live rank 0 refuses a stranger with a
 * wrong token, or one speaking garbage, without disturbing the ranks of its job. */
#include "../../transport/internal.h"
#include "transport_util.h"

#include <errno.h>
#include <fcntl.h>

TestSuite(transport_frames, .timeout = WF_TEST_TIMEOUT(60), .fini = wf_test_fini);

static wf__wbuf hello(uint32_t rank, uint32_t size, const char *token, size_t addr_len)
{
    wf__wbuf w;
    wf__wbuf_begin(&w, WF__F_HELLO);
    wf__wbuf_u32(&w, rank);
    wf__wbuf_u32(&w, size);
    wf__wbuf_u32(&w, 7);
    wf__wbuf_u32(&w, 1234);
    wf__wbuf_str(&w, token, strlen(token));
    wf__wbuf_str(&w, "node1", 5);
    uint8_t addr[64] = { 1, 2, 3 };
    wf__wbuf_blob(&w, addr, addr_len);
    cr_assert_eq(wf__wbuf_end(&w), 0);
    return w;
}

static int parse(const uint8_t *p, size_t n, wf__frame *f, size_t *used, char *err)
{
    return wf__frame_parse(p, n, f, used, err, 160);
}

Test(transport_frames, a_whole_frame_parses_and_every_prefix_asks_for_more)
{
    wf__wbuf w = hello(1, 2, "secret", 16);
    wf__frame f;
    size_t used;
    char err[160];
    for (size_t n = 0; n < w.len; n++) {
        cr_assert_eq(parse(w.p, n, &f, &used, err), 0, "prefix of %zu bytes", n);
        cr_assert_eq(used, 0);
    }
    cr_assert_eq(parse(w.p, w.len, &f, &used, err), 1);
    cr_assert_eq(used, w.len);
    cr_assert_eq(f.type, WF__F_HELLO);
    wf__hello h;
    cr_assert_eq(wf__hello_decode(f.payload, f.len, 2, "secret", &h, err, sizeof err), 0, "%s",
                 err);
    cr_assert_eq(h.rank, 1);
    cr_assert_str_eq(h.host, "node1");
    cr_assert_eq(h.addr_len, 16);
    free(w.p);
}

Test(transport_frames, bad_magic_version_type_and_length_are_refused)
{
    wf__wbuf w = hello(1, 2, "secret", 16);
    wf__frame f;
    size_t used;
    char err[160];
    uint8_t b[64];
    memcpy(b, w.p, 12);
    b[0] ^= 0xff; /* magic: refused from its first byte */
    cr_assert_eq(parse(b, 1, &f, &used, err), WF_EFORMAT);
    cr_assert(strstr(err, "magic"), "%s", err);
    memcpy(b, w.p, 12);
    b[4] = 9; /* version */
    cr_assert_eq(parse(b, 12, &f, &used, err), WF_EFORMAT);
    cr_assert(strstr(err, "version 9"), "%s", err);
    memcpy(b, w.p, 12);
    b[6] = 0x7f; /* type */
    cr_assert_eq(parse(b, 12, &f, &used, err), WF_EFORMAT);
    cr_assert(strstr(err, "unknown type"), "%s", err);
    memcpy(b, w.p, 12);
    b[8] = 0xff, b[9] = 0xff, b[10] = 0xff, b[11] = 0x7f; /* 2 GiB: refused before buffering */
    cr_assert_eq(parse(b, 12, &f, &used, err), WF_EFORMAT);
    cr_assert(strstr(err, "cap"), "%s", err);
    memcpy(b, w.p, 12);
    b[6] = WF__F_HEARTBEAT;
    b[8] = 1, b[9] = 0, b[10] = 0, b[11] = 0; /* a heartbeat carries nothing */
    cr_assert_eq(parse(b, 12, &f, &used, err), WF_EFORMAT);
    free(w.p);
}

Test(transport_frames, hello_with_wrong_token_size_rank_or_layout_is_refused)
{
    char err[160];
    wf__hello h;
    wf__frame f;
    size_t used;

    struct {
        wf__wbuf w;
        int want;
        const char *says;
    } cases[] = {
        { hello(1, 2, "guess", 16), WF_EPEER, "wrong token" },
        { hello(1, 2, "secre", 16), WF_EPEER, "wrong token" },
        { hello(1, 2, "secrett", 16), WF_EPEER, "wrong token" },
        { hello(1, 3, "secret", 16), WF_EPEER, "size 3" },
        { hello(0, 2, "secret", 16), WF_EPEER, "rank 0 out of range" },
        { hello(2, 2, "secret", 16), WF_EPEER, "rank 2 out of range" },
        { hello(1, 2, "secret", 0), WF_EFORMAT, "empty" },
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(parse(cases[i].w.p, cases[i].w.len, &f, &used, err), 1);
        int rc = wf__hello_decode(f.payload, f.len, 2, "secret", &h, err, sizeof err);
        cr_assert_eq(rc, cases[i].want, "case %zu: %s", i, err);
        cr_assert(strstr(err, cases[i].says), "case %zu: %s", i, err);
        free(cases[i].w.p);
    }
    /* Truncated payloads and trailing bytes. */
    wf__wbuf w = hello(1, 2, "secret", 16);
    for (size_t cut = 0; cut < w.len - WF__FRAME_HDR; cut++) {
        int rc = wf__hello_decode(w.p + WF__FRAME_HDR, cut, 2, "secret", &h, err, sizeof err);
        cr_assert_eq(rc, WF_EFORMAT, "cut at %zu", cut);
    }
    uint8_t *longer = malloc(w.len + 3);
    memcpy(longer, w.p, w.len);
    cr_assert_eq(wf__hello_decode(longer + WF__FRAME_HDR, w.len - WF__FRAME_HDR + 3, 2, "secret",
                                  &h, err, sizeof err),
                 WF_EFORMAT);
    cr_assert(strstr(err, "trailing"), "%s", err);
    free(longer);
    /* A string length that runs past the end. */
    w.p[WF__FRAME_HDR + 16] = 0xff;
    w.p[WF__FRAME_HDR + 17] = 0xff;
    cr_assert_eq(wf__hello_decode(w.p + WF__FRAME_HDR, w.len - WF__FRAME_HDR, 2, "secret", &h, err,
                                  sizeof err),
                 WF_EFORMAT);
    free(w.p);
}

Test(transport_frames, random_bytes_never_crash_the_parser_or_the_decoder)
{
    uint64_t seed = 42;
    uint8_t buf[512];
    char err[160];
    long n = wf_test_scaled(200000, 20000), frames = 0;
    for (long i = 0; i < n; i++) {
        size_t len = (size_t)wf_test_rand_below(&seed, sizeof buf);
        for (size_t j = 0; j < len; j++)
            buf[j] = (uint8_t)wf_test_rand(&seed);
        if (i % 2 && len >= 12) { /* a valid header half of the time, random body */
            wf__wbuf w;
            wf__wbuf_begin(&w, (uint16_t)(1 + wf_test_rand_below(&seed, WF__F_TYPE_END - 1)));
            memcpy(buf, w.p, 8);
            uint32_t body = (uint32_t)wf_test_rand_below(&seed, len - 11);
            memcpy(buf + 8, &body, 4);
            free(w.p);
        }
        wf__frame f;
        size_t used;
        int rc = parse(buf, len, &f, &used, err);
        cr_assert(rc == 0 || rc == 1 || rc == WF_EFORMAT);
        if (rc == 1) {
            frames++;
            cr_assert_leq(used, len);
            wf__hello h;
            (void)wf__hello_decode(f.payload, f.len, 4, "t", &h, err, sizeof err);
            wf__rbuf r = { .p = f.payload, .len = f.len };
            size_t k;
            while (!r.bad)
                (void)wf__rbuf_str(&r, 100, &k);
        }
    }
    cr_assert_gt(frames, 0, "some random inputs should have been whole frames");
}

/* ---- A live rank 0 and strangers ------------------------------------------------------ */

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    for (int i = 0; i < 500; i++) {
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
            return fd;
        close(fd);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        wf_test_sleep_us(10000);
    }
    close(fd);
    return -1;
}

/* Reads until EOF (or 5 s); returns the bytes read. */
static size_t read_all(int fd, uint8_t *buf, size_t cap)
{
    struct timeval tv = { .tv_sec = 5 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t n = 0;
    for (;;) {
        ssize_t k = read(fd, buf + n, cap - n);
        if (k <= 0)
            return n;
        n += (size_t)k;
    }
}

static int allreduce_once(wf_comm *c, int rank, int size, void *arg)
{
    int64_t x = rank + 1;
    TU_OK(wf_comm_allreduce(c, &x, &x, 1, WF_I64, WF_REDUCE_SUM));
    TU_CHECK(x == 3, "sum %lld", (long long)x);
    return 0;
}
TU_REGISTER(allreduce_once)

Test(transport_frames, strangers_are_refused_and_the_job_goes_on)
{
    /* Rank 0 runs alone first; rank 1 of the job joins 400 ms later. */
    tu_run t = { .size = 2, .body = allreduce_once, .timeout_s = 30 };
    t.port = tu_free_port();
    snprintf(t.addr, sizeof t.addr, "127.0.0.1:%d", t.port);
    pid_t p0 = tu_spawn(&t, 0);
    int fd = connect_to(t.port);
    cr_assert_geq(fd, 0, "rank 0 never listened");

    /* A wrong token: a REJECT frame comes back, then the connection closes. */
    wf__wbuf w = hello(1, 2, "not-the-token", 16);
    cr_assert_eq(write(fd, w.p, w.len), (ssize_t)w.len);
    free(w.p);
    uint8_t buf[4096];
    size_t n = read_all(fd, buf, sizeof buf);
    close(fd);
    wf__frame f;
    size_t used;
    char err[160];
    cr_assert_eq(parse(buf, n, &f, &used, err), 1, "got %zu bytes", n);
    cr_assert_eq(f.type, WF__F_REJECT);
    cr_assert(memmem(f.payload, f.len, "wrong token", 11), "reason: %.*s", (int)f.len, f.payload);

    /* Garbage: closed without a word. */
    fd = connect_to(t.port);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "GET / HTTP/1.0\r\n\r\n", 18), 18);
    cr_assert_eq(read_all(fd, buf, sizeof buf), 0);
    close(fd);

    /* A HELLO declaring a huge body: refused on its header. */
    fd = connect_to(t.port);
    w = hello(1, 2, "test-token", 16);
    w.p[8] = 0xff, w.p[9] = 0xff, w.p[10] = 0xff, w.p[11] = 0x0f;
    cr_assert_eq(write(fd, w.p, 12), 12);
    free(w.p);
    cr_assert_eq(read_all(fd, buf, sizeof buf), 0);
    close(fd);

    /* A truncated HELLO, then the stranger hangs up: nothing happens to rank 0. */
    fd = connect_to(t.port);
    w = hello(1, 2, "test-token", 16);
    cr_assert_eq(write(fd, w.p, w.len / 2), (ssize_t)(w.len / 2));
    free(w.p);
    close(fd);

    /* The real rank 1 joins: the job works. */
    pid_t p1 = tu_spawn(&t, 1);
    t.pids[0] = p0;
    t.pids[1] = p1;
    cr_assert(tu_wait(&t), "the job did not finish");
    for (int r = 0; r < 2; r++)
        cr_assert(WIFEXITED(t.status[r]) && WEXITSTATUS(t.status[r]) == 0, "rank %d failed", r);
}

/* ---- Strangers that never present a HELLO ------------------------------------------------- */

typedef struct loop_arg {
    int ready_fd; /* rank 0 writes a byte here once the comm is formed */
    int stop_fd;  /* rank 0 reads a byte from here (non-blocking) when the test is done */
} loop_arg;

/* All-reduces until rank 0 reads the stop byte (the flag travels in the all-reduce, so both
 * ranks stop after the same one), checking every sum. */
static int allreduce_until_stop(wf_comm *c, int rank, int size, void *arg)
{
    const loop_arg *a = arg;
    if (rank == 0 && write(a->ready_fd, "r", 1) != 1)
        return 2;
    long rounds = 0;
    for (;;) {
        char b;
        int64_t x[2] = { rank + 1, rank == 0 && read(a->stop_fd, &b, 1) == 1 };
        TU_OK(wf_comm_allreduce(c, x, x, 2, WF_I64, WF_REDUCE_SUM));
        TU_CHECK(x[0] == 3, "round %ld: sum %lld", rounds, (long long)x[0]);
        rounds++;
        if (x[1])
            break;
        wf_test_sleep_us(2000);
    }
    TU_CHECK(rounds > 10, "only %ld rounds", rounds);
    return 0;
}
TU_REGISTER(allreduce_until_stop)

static int fd_count(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    cr_assert_not_null(d, "%s", path);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Whether the server closed 'fd': a read returns 0 or ECONNRESET, not EAGAIN. */
static bool closed_by_server(int fd)
{
    char b[256];
    for (;;) {
        ssize_t k = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (k > 0)
            continue; /* a REJECT or anything else before the close */
        return k == 0 || errno == ECONNRESET;
    }
}

#define N_STRANGERS 100

/* Bug: a connection that sends nothing, only the magic, a HELLO at one byte per interval or
 * a partial payload stayed open for ever; 100 of them raised rank 0's open files by 100.
 * Now each has hello_timeout_ms to present a valid HELLO, at most 64 wait at once, and the
 * ranks all-reducing meanwhile never notice. */
Test(transport_frames, connections_without_a_hello_are_closed_after_the_deadline)
{
    int ready[2], stop[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(stop), 0);
    cr_assert_eq(fcntl(stop[0], F_SETFL, O_NONBLOCK | fcntl(stop[0], F_GETFL)), 0);
    loop_arg la = { .ready_fd = ready[1], .stop_fd = stop[0] };
    const uint32_t deadline_ms = 1000;
    tu_run t = { .size = 2,
                 .body = allreduce_until_stop,
                 .arg = &la,
                 .arg_size = sizeof la,
                 .timeout_s = WF_TEST_TIMEOUT(30),
                 .opts = { .hello_timeout_ms = deadline_ms } };
    tu_start(&t);
    char b;
    cr_assert_eq(read(ready[0], &b, 1), 1, "the comm never formed");
    wf_test_sleep_us(200000);
    int base = fd_count(t.pids[0]);

    /* Four kinds: silent, the magic only, a HELLO dripped a byte at a time, a HELLO cut. */
    wf__wbuf w = hello(1, 2, "test-token", 16);
    int fds[N_STRANGERS];
    size_t dripped[N_STRANGERS] = { 0 };
    uint64_t t0 = wf_test_now_ns();
    for (int i = 0; i < N_STRANGERS; i++) {
        fds[i] = connect_to(t.port);
        cr_assert_geq(fds[i], 0);
        if (i % 4 == 1)
            cr_assert_eq(write(fds[i], w.p, 4), 4);
        else if (i % 4 == 3)
            cr_assert_eq(write(fds[i], w.p, w.len / 2), (ssize_t)(w.len / 2));
    }
    wf_test_sleep_us(100000);
    int during = fd_count(t.pids[0]);
    cr_assert(during > base && during <= base + 64, "rank 0 had %d files, %d before", during, base);
    /* Drip, and wait until the deadline (plus a margin) has passed for every stranger. */
    while (wf_test_now_ns() - t0 < (uint64_t)(deadline_ms + 700) * 1000000u) {
        for (int i = 2; i < N_STRANGERS; i += 4)
            if (dripped[i] < w.len && send(fds[i], w.p + dripped[i], 1, MSG_NOSIGNAL) == 1)
                dripped[i]++;
        wf_test_sleep_us(100000);
    }
    int open_ones = 0;
    for (int i = 0; i < N_STRANGERS; i++) {
        open_ones += !closed_by_server(fds[i]);
        close(fds[i]);
    }
    free(w.p);
    cr_assert_eq(open_ones, 0, "%d of %d strangers still open %.1f s after connecting", open_ones,
                 N_STRANGERS, (double)(wf_test_now_ns() - t0) / 1e9);
    int after = fd_count(t.pids[0]);
    for (int i = 0; i < 100 && after != base; i++) {
        wf_test_sleep_us(20000);
        after = fd_count(t.pids[0]);
    }
    cr_assert_eq(after, base, "rank 0 has %d files, %d before the strangers (%d during)", after,
                 base, during);
    cr_log_info("rank 0: %d files before, %d with %d strangers, %d after", base, during,
                N_STRANGERS, after);
    cr_assert_eq(write(stop[1], "s", 1), 1);
    cr_assert(tu_wait(&t), "the job did not finish");
    for (int r = 0; r < 2; r++)
        cr_assert(WIFEXITED(t.status[r]) && WEXITSTATUS(t.status[r]) == 0, "rank %d failed", r);
    close(ready[0]);
    close(ready[1]);
    close(stop[0]);
    close(stop[1]);
}
