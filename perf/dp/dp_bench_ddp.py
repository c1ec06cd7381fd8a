#!/usr/bin/env python3
"""perf/dp/dp_bench_ddp.py: the PyTorch DDP peer of perf/dp_bench (gloo, N processes x 1 thread).

Trains the MLP 784-1024-1024-10 (ReLU, Adam lr 1e-3, softmax cross-entropy) on a fixed random
global batch (B rows; rank r takes rows [r*B/N, (r+1)*B/N)), times each step after a warm-up
and prints one JSON line from rank 0: median step seconds and the peak RSS of every rank.
Usage: dp_bench_ddp.py --ranks N --batch B --steps S --warmup W [--port P] [--timeout T]
                       [--bucket-cap-mb M]  (DDP's bucket_cap_mb; dp_bench --bucket-kib passes
                                             its size so both sides get the same buckets)

It never hangs: gloo is bound to the loopback interface (GLOO_SOCKET_IFNAME=lo: by default
gloo uses the address the host name resolves to, which may not be reachable), every rank's
rendezvous and collectives have a deadline, and a rank that fails (say the port was taken
between choosing and binding it) makes the parent stop the others and try again on a fresh
port; after three failed tries, or the overall deadline, it prints {"skip": why} and exits 1.
"""
import argparse
import datetime
import json
import os
import queue
import resource
import socket
import sys
import time

# Debian's torch calls the system's threaded OpenBLAS, whose pool torch.set_num_threads does not
# size: each rank would run 2 OpenBLAS threads on the 2 cores. The pool is sized when the library
# loads, so this is set before anything imports torch (the spawned ranks re-import this module
# first, and unpickling their queue imports torch).
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, args, q):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks,
                            timeout=datetime.timedelta(seconds=args.timeout))
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    kw = {"bucket_cap_mb": args.bucket_cap_mb} if args.bucket_cap_mb > 0 else {}
    ddp = torch.nn.parallel.DistributedDataParallel(model, **kw) if args.ranks > 1 else model
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(args.batch, 784, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    lo = rank * args.batch // args.ranks
    hi = (rank + 1) * args.batch // args.ranks
    xs, ys = x[lo:hi].contiguous(), y[lo:hi].contiguous()
    times = []
    for s in range(args.warmup + args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(ddp(xs), ys)
        loss.backward()
        opt.step()
        t = time.perf_counter() - t0
        if s >= args.warmup:
            times.append(t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    rsss = [None] * args.ranks
    dist.all_gather_object(rsss, rss)
    tt = [None] * args.ranks
    dist.all_gather_object(tt, times)
    if rank == 0:
        # a step lasts as long as its slowest rank
        per = [max(tt[r][i] for r in range(args.ranks)) for i in range(args.steps)]
        per.sort()
        q.put({"median_s": per[len(per) // 2], "peak_rss_mb": max(rsss),
               "loss": float(loss.detach())})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--port", type=int, default=0, help="0: a free port, chosen per try")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per try")
    ap.add_argument("--bucket-cap-mb", type=float, default=0,
                    help="DDP's bucket_cap_mb (0: its default, 25)")
    args = ap.parse_args()
    return launch(rank_main, args, "dp_bench_ddp.py")


def launch(target, args, prog):
    """Runs target(rank, args, queue) in args.ranks fresh processes (spawned) until one puts
    its result on the queue; retries on a fresh port (three tries); prints the result as one
    JSON line, or {"skip": why}. Returns the exit status. perf/pipeline's peer uses it too."""
    try:
        import torch.multiprocessing as mp
    except ImportError:
        print(json.dumps({"skip": "torch is not installed"}))
        return 1
    ctx = mp.get_context("spawn")
    why = "no try ran"
    for attempt in range(3):
        if attempt > 0 or args.port == 0:
            args.port = free_port()
        q = ctx.Queue()
        ps = [ctx.Process(target=target, args=(r, args, q)) for r in range(args.ranks)]
        for p in ps:
            p.start()
        res, deadline = None, time.monotonic() + args.timeout
        while res is None and time.monotonic() < deadline:
            try:
                res = q.get(timeout=0.2)
            except queue.Empty:
                dead = [r for r, p in enumerate(ps) if p.exitcode not in (None, 0)]
                if dead:
                    why = "rank %d exited with %d (port %d)" % (dead[0], ps[dead[0]].exitcode,
                                                                args.port)
                    break
        else:
            if res is None:
                why = "no result within %.0f s (port %d)" % (args.timeout, args.port)
        for p in ps:
            p.join(timeout=10 if res is not None else 0.5)
        for p in ps:
            if p.is_alive():
                p.kill()
                p.join()
        if res is not None:
            print(json.dumps(res), flush=True)
            return 0
        print("%s: try %d: %s" % (prog, attempt + 1, why), file=sys.stderr)
    print(json.dumps({"skip": why}), flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
