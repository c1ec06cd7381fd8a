#!/usr/bin/python3
# perf/train/eager_bench_torch.py: the PyTorch side of perf/train/eager_bench.c: the same eager
# step (MLP 64-1024-1024-10, ReLU, cross-entropy, Adam 1e-3, batch 256 of the bundled digits:
# batch t is rows [256 (t mod 7), +256), features divided by 16), zero_grad/forward/backward/
# step, at torch.set_num_threads(THREADS) (one process per thread count), timed the same way
# (warm-up steps, then the median of REPS timed steps); prints one JSON line with cpu_s, the
# process's CPU time per timed step (all threads).
# Debian's torch calls the system's threaded OpenBLAS, whose pool torch.set_num_threads does
# not size (at 1 torch thread a step took 51 ms of CPU in 26 ms of wall time), so the pool is
# sized to THREADS too, before torch loads it: the thread count is then the process's.
# Usage: eager_bench_torch.py DIGITS.csv.gz WARMUP REPS THREADS
import csv
import gzip
import json
import os
import sys
import time

if len(sys.argv) > 4:
    os.environ["OPENBLAS_NUM_THREADS"] = sys.argv[4]

try:
    import torch
    import torch.nn as nn
except ImportError:
    print(json.dumps({"bench": "mlp_eager_adam_b256", "impl": "pytorch",
                      "skip": "torch not installed (apt-get install python3-torch)"}))
    sys.exit(0)

path, warmup, reps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
torch.manual_seed(0)

BATCH, N_BATCHES = 256, 7
with gzip.open(path, "rt") as f:
    rows = [r for r in csv.reader(f) if r][: BATCH * N_BATCHES]
xs = torch.tensor([[float(v) / 16.0 for v in r[:-1]] for r in rows], dtype=torch.float32)
ys = torch.tensor([int(r[-1]) for r in rows], dtype=torch.int64)
batches = [(xs[b * BATCH:(b + 1) * BATCH].contiguous(), ys[b * BATCH:(b + 1) * BATCH].contiguous())
           for b in range(N_BATCHES)]

model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                      nn.Linear(1024, 10))
opt = torch.optim.Adam(model.parameters(), 1e-3)


def step(t):
    x, y = batches[t % N_BATCHES]
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


for t in range(warmup):
    step(t)
times = []
loss = float("nan")
c0 = time.process_time()
for i in range(reps):
    t0 = time.perf_counter()
    loss = step(warmup + i)
    times.append(time.perf_counter() - t0)
cpu = (time.process_time() - c0) / reps
times.sort()
med = times[len(times) // 2] if reps % 2 else 0.5 * (times[reps // 2 - 1] + times[reps // 2])
print(json.dumps({"bench": "mlp_eager_adam_b256", "impl": "pytorch", "mode": "eager",
                  "threads": threads, "median_s": med, "reps": reps, "cpu_s": round(cpu, 6),
                  "final_loss": round(loss, 5), "torch": torch.__version__}))
