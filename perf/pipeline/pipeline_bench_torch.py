#!/usr/bin/env python3
"""perf/pipeline/pipeline_bench_torch.py: the PyTorch peer of perf/pipeline_bench: the MLP
W-W-W-W-W-10 (ReLU, softmax cross-entropy, Adam lr 1e-3) split by hand into 2 processes
(stage 0: the first two layers; stage 1: the next two and the head), 1 thread each, each
pinned to its own core when the machine has two, trained in a GPipe schedule over
torch.distributed (gloo) send/recv: stage 0 runs every micro-batch's forward and sends its
activation, stage 1 receives it, runs its forward and the loss; then stage 1 runs each
micro-batch's backward and sends the activation's gradient, stage 0 receives it and runs its
backward; each stage then takes one Adam step. This is what a PyTorch user writes by hand.

The batch is perf/pipeline_bench's: B rows of the same LCG in [-1, 1), labels (7 i) mod 10,
split into m micro-batches of B/m rows; the loss is the mean over the batch (each
micro-batch's mean over m). It times each step after a warm-up (a barrier first; a step lasts
as long as its slower stage) and prints one JSON line from stage 0: the median step seconds,
the peak RSS of the larger stage and the first step's loss.
With --model gpt: perf/pipeline_bench's GPT instead (examples/train_gpt's model in PyTorch,
imported from examples/train_gpt/torch_compare.py: 4 blocks of d_model 128, 4 heads, context 64,
vocabulary 65, an untied head, AdamW lr 3e-4 with weight decay 0.1 on matrices only), stage 0
the embeddings and blocks 0-1, stage 1 blocks 2-3, ln_f, the head and the loss; the activation
that crosses is the residual stream [B/m, T, d]. Its batch is pipeline_bench's fill_gpt(): a
64-bit LCG from seed 11, token (state >> 33) mod 65, each target the next token of the stream.
Usage: pipeline_bench_torch.py --micro-batches M [--model mlp|gpt] [--batch B] [--width W]
                               [--steps S] [--warmup N] [--port P] [--timeout T]
Launching, deadlines and retries are dp_bench_ddp.py's (launch()): it never hangs.
"""
import argparse
import datetime
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dp"))
from dp_bench_ddp import launch  # noqa: E402

CLASSES = 10


def lcg_batch(batch, width):
    """The C driver's fill_batch(): 64-bit LCG from seed 7, top 53 bits scaled to [-1, 1)."""
    seed, mask, xs = 7, (1 << 64) - 1, [0.0] * (batch * width)
    for i in range(batch * width):
        seed = (seed * 6364136223846793005 + 1442695040888963407) & mask
        xs[i] = (seed >> 11) / 9007199254740992.0 * 2.0 - 1.0
    return xs, [(i * 7) % CLASSES for i in range(batch)]


GPT_T, GPT_D, GPT_HEADS, GPT_VOCAB, GPT_LAYERS = 64, 128, 4, 65, 4


def gpt_batch(batch):
    """pipeline_bench's fill_gpt(): inputs and next-token targets of one LCG stream."""
    seed, mask, stream = 11, (1 << 64) - 1, []
    for _ in range(batch * GPT_T + 1):
        seed = (seed * 6364136223846793005 + 1442695040888963407) & mask
        stream.append((seed >> 33) % GPT_VOCAB)
    return stream[:-1], stream[1:]


def gpt_stage(rank, nn, torch):
    """Stage 'rank' of the GPT (torch_compare.py's modules): a module from tokens (stage 0) or
    the residual stream (stage 1) to the stream (stage 0) or the logits (stage 1)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "examples", "train_gpt"))
    from torch_compare import GPT  # noqa: E402

    full = GPT(GPT_VOCAB, GPT_T, GPT_D, GPT_HEADS, GPT_LAYERS, False)
    tr, half = full.transformer, GPT_LAYERS // 2

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            if rank == 0:
                self.wte, self.wpe = tr["wte"], tr["wpe"]
                self.h = nn.ModuleList(tr["h"][:half])
            else:
                self.h = nn.ModuleList(tr["h"][half:])
                self.ln_f, self.lm_head = tr["ln_f"], full.lm_head

        def forward(self, x):
            if rank == 0:
                x = self.wte(x) + self.wpe(torch.arange(x.size(1)))
            for b in self.h:
                x = b(x)
            return x if rank == 0 else self.lm_head(self.ln_f(x))

    return Stage()


def rank_main(rank, args, q):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    if len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=args.timeout))
    torch.manual_seed(1 + rank)
    w, m = args.width, args.micro_batches
    rows = args.batch // m
    gpt = args.model == "gpt"
    if gpt:
        stage = gpt_stage(rank, nn, torch)
        xs, ys = gpt_batch(args.batch)
        t = torch.tensor(xs if rank == 0 else ys, dtype=torch.int64).reshape(args.batch, GPT_T)
        micro = list(t.split(rows))
        decay = [p for p in stage.parameters() if p.dim() >= 2]
        rest = [p for p in stage.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": rest, "weight_decay": 0.0}], lr=3e-4)
    elif rank == 0:
        stage = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU())
        xs, _ = lcg_batch(args.batch, w)
        x = torch.tensor(xs, dtype=torch.float32).reshape(args.batch, w)
        micro = list(x.split(rows))
    else:
        stage = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                              nn.Linear(w, CLASSES))
        _, ys = lcg_batch(args.batch, 0)
        micro = list(torch.tensor(ys, dtype=torch.int64).split(rows))
    if not gpt:
        opt = torch.optim.Adam(stage.parameters(), lr=1e-3)
    act_shape = (rows, GPT_T, GPT_D) if gpt else (rows, w)
    times, loss0 = [], None
    for s in range(args.warmup + args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            outs = []
            for xm in micro:  # every forward, then every backward: GPipe
                a = stage(xm)
                dist.send(a.detach(), 1)
                outs.append(a)
            for a in outs:
                g = torch.empty_like(a)
                dist.recv(g, 1)
                a.backward(g)
        else:
            ins, losses = [], []
            for ym in micro:
                a = torch.empty(*act_shape)
                dist.recv(a, 0)
                a.requires_grad_(True)
                out = stage(a)
                if gpt:
                    out, ym = out.reshape(-1, GPT_VOCAB), ym.reshape(-1)
                losses.append(nn.functional.cross_entropy(out, ym) / m)
                ins.append(a)
            for a, loss in zip(ins, losses):
                loss.backward()
                dist.send(a.grad, 0)
            if s == 0:
                loss0 = float(sum(float(l) for l in losses))
        opt.step()
        t = time.perf_counter() - t0
        if s >= args.warmup:
            times.append(t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    got = [None, None]
    dist.all_gather_object(got, (rss, times, loss0))
    if rank == 0:
        per = sorted(max(got[0][1][i], got[1][1][i]) for i in range(args.steps))
        q.put({"median_s": per[len(per) // 2], "peak_rss_mb": max(got[0][0], got[1][0]),
               "loss0": got[1][2]})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--model", choices=("mlp", "gpt"), default="mlp")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--port", type=int, default=0, help="0: a free port, chosen per try")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per try")
    args = ap.parse_args()
    if args.micro_batches < 1 or args.batch % args.micro_batches:
        print("pipeline_bench_torch.py: --micro-batches must divide --batch", file=sys.stderr)
        return 2
    args.ranks = 2
    return launch(rank_main, args, "pipeline_bench_torch.py")


if __name__ == "__main__":
    sys.exit(main())
