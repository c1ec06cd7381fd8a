#!/usr/bin/python3
# examples/train_gpt/torch_compare.py: replays a train_gpt run in PyTorch and compares the
# losses step by step. It runs
#   train_gpt --steps 0 --save INIT          (weft's initial weights, nanoGPT's names)
#   train_gpt --init INIT --steps N --log LOG ...
# then builds nanoGPT's model in PyTorch from INIT (load_state_dict, strict), draws the same
# batches (train_gpt's splitmix64 windows of the first 90% of the text), and trains it with
# the same step: AdamW with weight decay on matrices only, gradients clipped to global norm
# 1, the same warm-up and cosine learning rate; each step's loss (before that step's update)
# must match train_gpt's within --rtol (relative; f32 sums in another order drift ~1e-6 a
# step).
# Usage: torch_compare.py TRAIN_GPT [--text FILE] [--steps N] [--context T] [--d-model D]
#        [--heads H] [--layers L] [--batch B] [--lr LR] [--seed S] [--tie-head] [--rtol R]
# Exit status 0 when every step agrees, 1 otherwise, 77 (skip) if torch does not import.
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn as nn
except ImportError:
    # In CI (CI=true) a missing torch is a failure, not a skip: scripts/setup.sh --tests
    # installs it, so a skip there would hide a broken setup.
    if os.environ.get("CI") == "true":
        print("torch_compare: torch is not installed, and CI=true: failed (scripts/setup.sh --tests"
              " installs python3-torch)")
        sys.exit(1)
    print("torch_compare: torch is not installed (apt-get install python3-torch); skipped")
    sys.exit(77)

M64 = (1 << 64) - 1


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    out = {}
    kinds = {"F32": torch.float32, "F64": torch.float64, "I32": torch.int32, "I64": torch.int64}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = bytearray(data[8 + n + a : 8 + n + b])
        t = torch.frombuffer(raw, dtype=kinds[info["dtype"]]) if raw else torch.zeros(0)
        out[name] = t.reshape(info["shape"]).clone()
    return out


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.ModuleDict({"c_attn": nn.Linear(d, 3 * d), "c_proj": nn.Linear(d, d)})
        self.mlp = nn.ModuleDict({"c_fc": nn.Linear(d, 4 * d), "c_proj": nn.Linear(4 * d, d)})

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn["c_attn"](self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attn["c_proj"](y)
        return x + self.mlp["c_proj"](nn.functional.gelu(self.mlp["c_fc"](self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, ctx, d, heads, layers, tie):
        super().__init__()
        self.tie = tie
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab, d),
                "wpe": nn.Embedding(ctx, d),
                "h": nn.ModuleList(Block(d, heads) for _ in range(layers)),
                "ln_f": nn.LayerNorm(d),
            }
        )
        if not tie:
            self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        tr = self.transformer
        x = tr["wte"](idx) + tr["wpe"](torch.arange(idx.size(1)))
        for b in tr["h"]:
            x = b(x)
        x = tr["ln_f"](x)
        return x @ tr["wte"].weight.t() if self.tie else self.lm_head(x)


def splitmix(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def lr_at(step, lr, warmup, total, min_lr):
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    t, T = step - warmup, total - warmup
    return min_lr if t >= T else min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * t / T))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train_gpt")
    ap.add_argument("--text")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tie-head", action="store_true")
    ap.add_argument("--rtol", type=float, default=1e-4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    shape = ["--context", str(a.context), "--d-model", str(a.d_model), "--heads", str(a.heads),
             "--layers", str(a.layers), "--batch", str(a.batch), "--seed", str(a.seed),
             "--lr", repr(a.lr), "--quiet"]
    shape += ["--text", a.text] if a.text else []
    shape += ["--tie-head"] if a.tie_head else []
    with tempfile.TemporaryDirectory() as tmp:
        init, log = os.path.join(tmp, "init.safetensors"), os.path.join(tmp, "log.jsonl")
        subprocess.run([a.train_gpt, *shape, "--steps", "0", "--save", init], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([a.train_gpt, *shape, "--steps", str(a.steps), "--init", init,
                        "--log", log], check=True, stdout=subprocess.DEVNULL)
        weft = [json.loads(line)["loss"] for line in open(log)]
        ts = read_safetensors(init)
    text = open(a.text, "rb").read() if a.text else None
    if text is None:  # train_gpt's bundled text: beside this script
        here = os.path.dirname(os.path.abspath(__file__))
        text = open(os.path.join(here, "data", "us-founding-documents.txt"), "rb").read()
    vocab = sorted(set(text))
    assert ts["train_gpt.vocab"].tolist() == vocab, "the vocabularies differ"
    ids = {b: i for i, b in enumerate(vocab)}
    tokens = torch.tensor([ids[b] for b in text], dtype=torch.int64)
    n_train = len(tokens) - len(tokens) // 10

    model = GPT(len(vocab), a.context, a.d_model, a.heads, a.layers, a.tie_head)
    model.load_state_dict({k: v for k, v in ts.items() if k in model.state_dict()}, strict=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=a.lr)
    warmup = min(a.steps // 10, 100)
    total = a.steps if a.steps > warmup else warmup + 1
    rng = (a.seed * 0x2545F4914F6CDD1D + 1) & M64
    span = n_train - a.context
    worst = 0.0
    for step in range(a.steps):
        rows = []
        for _ in range(a.batch):
            rng, r = splitmix(rng)
            rows.append(r % span)
        x = torch.stack([tokens[o : o + a.context] for o in rows])
        y = torch.stack([tokens[o + 1 : o + 1 + a.context] for o in rows])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.lr, warmup, total, a.lr / 10)
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        rel = abs(loss.item() - weft[step]) / abs(loss.item())
        worst = max(worst, rel)
        if rel > a.rtol:
            print(f"torch_compare: step {step}: weft {weft[step]:.7g}, pytorch {loss.item():.7g} "
                  f"(relative difference {rel:.2g} > {a.rtol:g})")
            sys.exit(1)
    print(json.dumps({"compare": "train_gpt", "steps": a.steps, "max_rel_diff": worst,
                      "first_loss": weft[0], "last_loss": weft[-1], "torch": torch.__version__}))
    print(f"torch_compare: {a.steps} steps agree with PyTorch within {a.rtol:g} "
          f"(largest relative difference {worst:.2g})")


if __name__ == "__main__":
    main()
