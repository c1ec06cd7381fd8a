/* transport/nccl.c: collectives on device memory through NCCL, behind the same calls as the
 * host collectives (built only with CUDA and NCCL: WF_HAVE_NCCL, transport/CMakeLists.txt).
 * A collective whose buffers are CUDA device memory (cudaPointerGetAttributes) comes here
 * from coll.c. The first one creates the NCCL communicator: rank 0's ncclGetUniqueId goes to
 * every rank by the comm's host broadcast, then ncclCommInitRankConfig in nonblocking mode on
 * the device that holds the buffer. Each collective is enqueued on the comm's own stream and
 * waited for by polling (ncclCommGetAsyncError, cudaStreamQuery) against the comm's health
 * and deadline: NCCL has no watchdog, so a dead rank (seen by the control plane) or a passed
 * deadline aborts the NCCL communicator (ncclCommAbort) and fails the call with the comm's
 * error, naming the rank, instead of hanging in a kernel.
 * Contract: the buffers are ready when the call is made (their producers' streams
 * synchronized) and the call returns once the result is in place (as the host path).
 * Owns: the NCCL communicator and its stream (wf_comm.nccl, .nccl_stream).
 * Not here: the host collectives (coll.c), CUDA device management (devices/). */
#include "internal.h"

#include <cuda_runtime_api.h>

#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int wf__nccl_device_of(wf_comm *c, const void *p)
{
    if (!p)
        return -1;
    if (c->cuda_devices < 0) { /* once per comm: no CUDA (or no driver) means host memory */
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess)
            n = 0;
        (void)cudaGetLastError();
        c->cuda_devices = n;
    }
    if (c->cuda_devices == 0)
        return -1;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

static void nccl_abort(wf_comm *c)
{
    if (c->nccl)
        ncclCommAbort((ncclComm_t)c->nccl);
    c->nccl = NULL;
}

/* Polls until the NCCL work of this call is done, the comm fails or the deadline passes. */
static int nccl_wait(wf_comm *c, const char *what)
{
    uint64_t start = wf__net_now_ns(), dl = start + (uint64_t)c->op_timeout_ms * 1000000u;
    unsigned spins = 0;
    for (;;) {
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError((ncclComm_t)c->nccl, &st) != ncclSuccess ||
            (st != ncclSuccess && st != ncclInProgress)) {
            nccl_abort(c);
            return wf__comm_fail(c, WF_EDEVICE, c->rank, "rank %d: %s: NCCL: %s", c->rank, what,
                                 ncclGetErrorString(st));
        }
        if (st == ncclSuccess) {
            cudaError_t q = cudaStreamQuery((cudaStream_t)c->nccl_stream);
            if (q == cudaSuccess)
                return 0;
            if (q != cudaErrorNotReady) {
                (void)cudaGetLastError();
                nccl_abort(c);
                return wf__comm_fail(c, WF_EDEVICE, c->rank, "rank %d: %s: CUDA: %s", c->rank, what,
                                     cudaGetErrorString(q));
            }
        }
        if (atomic_load(&c->failed)) {
            nccl_abort(c); /* the kernels wait for a dead rank: take them down */
            return wf__comm_failed(c);
        }
        uint64_t now = wf__net_now_ns();
        if (now >= dl) {
            nccl_abort(c);
            return wf__comm_fail(c, WF_ETIMEDOUT, -1, "%s: rank %d: no progress within %llu ms",
                                 what, c->rank, (unsigned long long)((now - start) / 1000000u));
        }
        if (++spins % 64 == 0)
            sched_yield();
    }
}

/* The NCCL communicator, made by the first device collective on 'device'. */
static int nccl_ready(wf_comm *c, int device, const char *what)
{
    if (c->nccl) {
        if (device != c->nccl_device)
            return wf__err(WF_EINVAL,
                           "%s: the buffer is on CUDA device %d, this comm's NCCL communicator "
                           "on device %d",
                           what, device, c->nccl_device);
        return cudaSetDevice(device) == cudaSuccess
                   ? 0
                   : wf__err(WF_EDEVICE, "%s: cudaSetDevice(%d) failed", what, device);
    }

    struct {
        int32_t ok;
        ncclUniqueId id;
    } boot;

    memset(&boot, 0, sizeof boot);
    if (cudaSetDevice(device) != cudaSuccess)
        return wf__err(WF_EDEVICE, "%s: cudaSetDevice(%d) failed", what, device);
    char why[160] = "";
    if (c->rank == 0) {
        ncclResult_t st = ncclGetUniqueId(&boot.id);
        boot.ok = st == ncclSuccess;
        if (!boot.ok)
            snprintf(why, sizeof why, "ncclGetUniqueId: %s", ncclGetErrorString(st));
    }
    /* Every rank takes part even after rank 0 failed, and all learn it. */
    int rc = wf_comm_broadcast(c, &boot, sizeof boot, 0);
    if (rc < 0)
        return rc;
    if (!boot.ok)
        return wf__err(WF_EDEVICE, "%s: rank 0 could not make an NCCL id%s%s", what,
                       why[0] ? ": " : "", why);
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        return wf__err(WF_EDEVICE, "%s: cannot create a CUDA stream on device %d", what, device);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* init and collectives return at once: nccl_wait() watches them */
    ncclComm_t comm = NULL;
    ncclResult_t st = ncclCommInitRankConfig(&comm, c->size, boot.id, c->rank, &cfg);
    c->nccl = comm;
    c->nccl_stream = s;
    c->nccl_device = device;
    if (st != ncclSuccess && st != ncclInProgress) {
        nccl_abort(c);
        return wf__comm_fail(c, WF_EDEVICE, c->rank, "rank %d: %s: ncclCommInitRank: %s", c->rank,
                             what, ncclGetErrorString(st));
    }
    /* Initialization is done when the async error leaves ncclInProgress. */
    uint64_t dl = wf__net_now_ns() + (uint64_t)c->connect_timeout_ms * 1000000u;
    for (;;) {
        if (ncclCommGetAsyncError(comm, &st) != ncclSuccess)
            st = ncclInternalError;
        if (st == ncclSuccess)
            return 0;
        if (st != ncclInProgress) {
            nccl_abort(c);
            return wf__comm_fail(c, WF_EDEVICE, c->rank, "rank %d: %s: ncclCommInitRank: %s",
                                 c->rank, what, ncclGetErrorString(st));
        }
        if (atomic_load(&c->failed)) {
            nccl_abort(c);
            return wf__comm_failed(c);
        }
        if (wf__net_now_ns() > dl) {
            nccl_abort(c);
            return wf__comm_fail(c, WF_ETIMEDOUT, -1,
                                 "%s: rank %d: NCCL init not done within %u ms", what, c->rank,
                                 c->connect_timeout_ms);
        }
        sched_yield();
    }
}

static int nccl_type(wf_dtype dt, ncclDataType_t *t)
{
    switch (dt) {
    case WF_F32:
        *t = ncclFloat32;
        return 0;
    case WF_F64:
        *t = ncclFloat64;
        return 0;
    case WF_I32:
        *t = ncclInt32;
        return 0;
    case WF_I64:
        *t = ncclInt64;
        return 0;
    case WF_BF16:
        *t = ncclBfloat16;
        return 0;
    case WF_U8:
        *t = ncclUint8;
        return 0;
    default:
        return -1;
    }
}

/* Maps dtype and op, then readies the communicator for 'device' (the prologue of every
 * reducing collective); integer means are refused (ncclAvg rounds differently from the host
 * path's truncation, and weft has no device kernel to divide afterwards). */
static int nccl_args(wf_comm *c, int device, const char *what, wf_dtype dt, wf_reduce_op op,
                     ncclDataType_t *t, ncclRedOp_t *o)
{
    if (nccl_type(dt, t) < 0)
        return wf__err(WF_EINVAL, "%s: dtype %s on a CUDA device", what, wf_dtype_name(dt));
    if (op == WF_REDUCE_MEAN && (dt == WF_I32 || dt == WF_I64))
        return wf__err(WF_EINVAL, "%s: the mean of %s is not supported on CUDA devices", what,
                       wf_dtype_name(dt));
    *o = op == WF_REDUCE_MAX ? ncclMax : op == WF_REDUCE_MEAN ? ncclAvg : ncclSum;
    return nccl_ready(c, device, what);
}

static int launched(wf_comm *c, ncclResult_t st, const char *what)
{
    if (st != ncclSuccess && st != ncclInProgress) {
        nccl_abort(c);
        return wf__comm_fail(c, WF_EDEVICE, c->rank, "rank %d: %s: NCCL: %s", c->rank, what,
                             ncclGetErrorString(st));
    }
    return nccl_wait(c, what);
}

int wf__nccl_allreduce(wf_comm *c, int device, const void *send, void *recv, size_t count,
                       wf_dtype dt, wf_reduce_op op)
{
    char what[128];
    snprintf(what, sizeof what, "allreduce #%u (NCCL, %zu x %s)", ++c->coll_seq, count,
             wf_dtype_name(dt));
    ncclDataType_t t = ncclFloat32;
    ncclRedOp_t o = ncclSum;
    int rc = nccl_args(c, device, what, dt, op, &t, &o);
    if (rc < 0)
        return rc;
    return launched(
        c,
        ncclAllReduce(send, recv, count, t, o, (ncclComm_t)c->nccl, (cudaStream_t)c->nccl_stream),
        what);
}

int wf__nccl_reduce_scatter(wf_comm *c, int device, const void *send, void *recv, size_t count,
                            wf_dtype dt, wf_reduce_op op)
{
    char what[128];
    snprintf(what, sizeof what, "reduce_scatter #%u (NCCL, %zu x %s per rank)", ++c->coll_seq,
             count, wf_dtype_name(dt));
    ncclDataType_t t = ncclFloat32;
    ncclRedOp_t o = ncclSum;
    int rc = nccl_args(c, device, what, dt, op, &t, &o);
    if (rc < 0)
        return rc;
    return launched(c,
                    ncclReduceScatter(send, recv, count, t, o, (ncclComm_t)c->nccl,
                                      (cudaStream_t)c->nccl_stream),
                    what);
}

int wf__nccl_allgather(wf_comm *c, int device, const void *send, void *recv, size_t bytes)
{
    char what[128];
    snprintf(what, sizeof what, "allgather #%u (NCCL, %zu bytes per rank)", ++c->coll_seq, bytes);
    int rc = nccl_ready(c, device, what);
    if (rc < 0)
        return rc;
    return launched(c,
                    ncclAllGather(send, recv, bytes, ncclUint8, (ncclComm_t)c->nccl,
                                  (cudaStream_t)c->nccl_stream),
                    what);
}

int wf__nccl_broadcast(wf_comm *c, int device, void *buf, size_t bytes, int root)
{
    char what[128];
    snprintf(what, sizeof what, "broadcast #%u (NCCL, %zu bytes from rank %d)", ++c->coll_seq,
             bytes, root);
    int rc = nccl_ready(c, device, what);
    if (rc < 0)
        return rc;
    return launched(c,
                    ncclBroadcast(buf, buf, bytes, ncclUint8, root, (ncclComm_t)c->nccl,
                                  (cudaStream_t)c->nccl_stream),
                    what);
}

void wf__nccl_fini(wf_comm *c)
{
    if (c->nccl) {
        /* After a failure the communicator was aborted already; a healthy one is destroyed
         * after the goodbye round, when every rank is done with it. */
        ncclComm_t comm = (ncclComm_t)c->nccl;
        ncclResult_t st = ncclCommFinalize(comm);
        uint64_t dl = wf__net_now_ns() + 2000000000u;
        while (st == ncclInProgress && wf__net_now_ns() < dl)
            if (ncclCommGetAsyncError(comm, &st) != ncclSuccess)
                st = ncclInternalError;
        if (st == ncclSuccess)
            ncclCommDestroy(comm);
        else
            ncclCommAbort(comm);
        c->nccl = NULL;
    }
    if (c->nccl_stream)
        cudaStreamDestroy((cudaStream_t)c->nccl_stream);
    c->nccl_stream = NULL;
}
