/* allreduce_hello.c: what the transport offers today, in one program (docs/distributed.md):
 * a communicator from the launcher's environment, a message around a ring of ranks, an
 * all-reduce, a broadcast and a gradient bucket, each result checked on every rank.
 * Run: weft-run -n 2 ./allreduce_hello   (alone it is one rank of one)
 * Build: cc allreduce_hello.c $(pkg-config --cflags --libs weft) -o allreduce_hello */
#include <weft/weft.h>

#include <stdio.h>
#include <string.h>

static int fail(const char *what, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", what, wf_strerror(rc), wf_last_errmsg());
    return 1;
}

int main(void)
{
    /* Rank, size, rendezvous address and token: weft-run's WEFT_* variables, or Open MPI's,
     * Slurm's or PMI's rank and size. Without any, this process is rank 0 of 1. */
    wf_comm_opts o = { .rank = 0, .size = 1 };
    int rc = wf_dist_opts_from_env(&o);
    if (rc < 0)
        return fail("wf_dist_opts_from_env", rc);
    wf_comm *c;
    if ((rc = wf_comm_create(NULL, &o, &c)) < 0) /* every rank calls it; no runtime needed */
        return fail("wf_comm_create", rc);
    int rank = wf_comm_rank(c), size = wf_comm_size(c);

    /* Point to point: each rank sends its rank to the next and receives from the previous.
     * The receive is posted first; both complete in wf_comm_wait(). */
    int32_t mine = rank, theirs = -1;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    wf_comm_req *rr, *sr;
    if ((rc = wf_comm_irecv(c, prev, WF_COMM_KEY(0, 1), &theirs, sizeof theirs, &rr)) < 0 ||
        (rc = wf_comm_isend(c, next, WF_COMM_KEY(0, 1), &mine, sizeof mine, &sr)) < 0 ||
        (rc = wf_comm_wait(sr)) < 0 || (rc = wf_comm_wait(rr)) < 0)
        return fail("ring", rc);
    printf("rank %d of %d: got %d from rank %d\n", rank, size, (int)theirs, prev);

    /* All-reduce: rank r contributes r + 1 to every element; every rank gets the sum. */
    float v[1000];
    for (int i = 0; i < 1000; i++)
        v[i] = (float)(rank + 1);
    if ((rc = wf_comm_allreduce(c, v, v, 1000, WF_F32, WF_REDUCE_SUM)) < 0)
        return fail("wf_comm_allreduce", rc);
    float want = (float)(size * (size + 1) / 2);
    int ok = theirs == prev && v[0] == want && v[999] == want;

    /* Broadcast: rank 0's bytes reach everyone. */
    char msg[32] = "";
    if (rank == 0)
        snprintf(msg, sizeof msg, "hello from rank 0");
    if ((rc = wf_comm_broadcast(c, msg, sizeof msg, 0)) < 0)
        return fail("wf_comm_broadcast", rc);
    ok = ok && strcmp(msg, "hello from rank 0") == 0;

    /* A gradient bucket: small tensors packed and averaged in the background; their
     * results are written back by the time wf_comm_bucket_wait() returns. */
    wf_comm_bucket *b;
    float g1[3] = { (float)rank, 1, 2 }, g2[2] = { 10, (float)(2 * rank) };
    wf_bucket_opts bo = { .dtype = WF_F32, .op = WF_REDUCE_MEAN };
    if ((rc = wf_comm_bucket_create(c, &bo, &b)) < 0 || (rc = wf_comm_bucket_add(b, g1, 3)) < 0 ||
        (rc = wf_comm_bucket_add(b, g2, 2)) < 0 || (rc = wf_comm_bucket_wait(b)) < 0)
        return fail("bucket", rc);
    wf_comm_bucket_destroy(b);
    float mean_rank = (float)(size - 1) / 2;
    ok = ok && g1[0] == mean_rank && g1[2] == 2 && g2[0] == 10 && g2[1] == 2 * mean_rank;

    printf("rank %d of %d: all-reduce sum %g (expected %g), broadcast '%s', bucket mean %g: %s\n",
           rank, size, v[0], want, msg, g1[0], ok ? "ok" : "WRONG");
    if ((rc = wf_comm_barrier(c)) < 0)
        return fail("wf_comm_barrier", rc);
    wf_comm_destroy(c);
    return ok ? 0 : 1;
}
