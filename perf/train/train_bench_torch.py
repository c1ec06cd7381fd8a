#!/usr/bin/python3
# perf/train/train_bench_torch.py: the PyTorch side of perf/train/train_bench.c: the same
# training steps (MLP 784-1024-1024-10 + Adam, batch 256; the small CNN + SGD momentum 0.9,
# batch 64; f32, synthetic data), timed the same way (warm-up steps, then the median of
# 'reps' timed steps), printing one JSON line per case with peak_rss_mb of this process.
# PyTorch runs with its best thread setting here: torch.set_num_threads(cores).
# Usage: train_bench_torch.py CASE WARMUP REPS THREADS
import json
import resource
import sys
import time

try:
    import torch
    import torch.nn as nn
except ImportError:
    print(json.dumps({"skip": "torch not installed (apt-get install python3-torch)"}))
    sys.exit(0)

case, warmup, reps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
torch.manual_seed(0)
if case == "mlp_adam_b256":
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))
    x = torch.rand(256, 784)
    y = torch.randint(0, 10, (256,))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
else:
    model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1600, 128),
                          nn.ReLU(), nn.Linear(128, 10))
    x = torch.rand(64, 1, 28, 28)
    y = torch.randint(0, 10, (64,))
    opt = torch.optim.SGD(model.parameters(), 0.01, momentum=0.9)


def step():
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


for _ in range(warmup):
    step()
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
times.sort()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
print(json.dumps({"bench": case, "impl": "pytorch", "threads": threads,
                  "median_s": times[len(times) // 2], "reps": reps,
                  "peak_rss_mb": round(rss, 1), "torch": torch.__version__}))
