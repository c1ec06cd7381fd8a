#!/usr/bin/python3
# perf/train/train_bench_torch.py: the PyTorch side of perf/train/train_bench.c: the same
# training steps (MLP 784-1024-1024-10 + Adam, batch 256; the small CNN + SGD momentum 0.9,
# batch 64; the character-level GPT of examples/train_gpt, nanoGPT's model, + AdamW with
# nanoGPT's decay groups and clipping, batch 32 x 64 tokens; f32, synthetic data), timed the
# same way (warm-up steps, then the median of 'reps' timed steps), printing one JSON line per
# case with peak_rss_mb of this process and cpu_s, the process's CPU time per timed step (all
# threads) at the reported thread setting.
# PyTorch runs with its best thread setting: 1 and THREADS torch threads are both timed.
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


class Block(nn.Module):
    # nanoGPT's block: attention written out (matmul, causal mask, softmax, matmul), as
    # nanoGPT does where F.scaled_dot_product_attention is missing and as weft computes it
    def __init__(self, d, heads, ctx):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj, self.gelu = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.GELU()
        self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx)).view(1, 1, ctx, ctx))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=65, ctx=64, d=128, heads=4, layers=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d, heads, ctx) for _ in range(layers))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for b in self.h:
            x = b(x)
        return self.lm_head(self.ln_f(x))


clip = 0.0
if case == "gpt_adamw_b32":
    model = GPT()
    tokens = torch.randint(0, 65, (32, 65))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=3e-4)
    clip = 1.0
elif case == "mlp_adam_b256":
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
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
    loss.backward()
    if clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item()


# Its best thread setting: Debian's torch calls the threaded OpenBLAS, whose own threads fight
# torch's intra-op threads, so one torch thread is often faster here than one per core (MLP,
# 2 cores: 31 ms against 58 ms). Each setting is timed; the fastest is reported.
best = None
for nt in sorted({1, threads}):
    torch.set_num_threads(nt)
    for _ in range(warmup):
        step()
    times = []
    c0 = time.process_time()
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    cpu = (time.process_time() - c0) / reps
    times.sort()
    med = times[len(times) // 2]
    if best is None or med < best[1]:
        best = (nt, med, cpu)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
print(json.dumps({"bench": case, "impl": "pytorch", "threads": best[0],
                  "median_s": best[1], "reps": reps, "cpu_s": round(best[2], 6),
                  "peak_rss_mb": round(rss, 1), "torch": torch.__version__}))
