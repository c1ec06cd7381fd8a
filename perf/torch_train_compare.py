#!/usr/bin/python3
# perf/torch_train_compare.py: replays a weft-train run in PyTorch and compares the losses step
# by step. It makes initial weights (PyTorch's default init, seeded), writes them as a
# safetensors file (json + struct: no safetensors package needed), trains the same model in
# PyTorch with the same data preparation (the last 20% of the rows are the test set; each
# feature standardised with the training set's f64 mean and population std, constant
# features only centred), the same optimizer and batches in file order, then runs
#   weft-train --init FILE --no-shuffle --log LOG ...
# and compares each step's loss (the forward pass before that step's update).
# Usage: perf/torch_train_compare.py WEFT_TRAIN [--model mlp|cnn] [--optimizer adam|sgd|...]
#        [--steps N] [--batch B] [--lr LR] [--data-csv FILE] [--rtol R]
# Exit status 0 when every step agrees within --rtol (default 1e-4 relative to the loss: f32
# arithmetic summed in different orders drifts by ~1e-6 per step), 1 otherwise; 77 (skip) if
# torch does not import. Prints one JSON line per model with the largest relative difference.
import argparse
import gzip
import json
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
        print("torch_train_compare: torch is not installed, and CI=true: failed (scripts/setup.sh --tests"
              " installs python3-torch)")
        sys.exit(1)
    print("torch_train_compare: torch is not installed (apt-get install python3-torch); skipped")
    sys.exit(77)


def load_csv(path):
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    rows = []
    with opener(path, "rt") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append([float(v) for v in line.split(",")])
            except ValueError:
                if rows:
                    raise
    x = torch.tensor([r[:-1] for r in rows], dtype=torch.float32)
    y = torch.tensor([int(r[-1]) for r in rows], dtype=torch.int64)
    return x, y


def prepare(x, y, test_fraction=0.2):
    n = len(y)
    nt = int(n * test_fraction + 0.5)
    xtr, ytr = x[: n - nt], y[: n - nt]
    mean = xtr.double().mean(0)
    std = xtr.double().std(0, unbiased=False)
    std[std == 0] = 1
    xtr = ((xtr.double() - mean) / std).float()
    return xtr, ytr


def model(kind, features, classes):
    if kind == "mlp":
        return None, nn.ModuleDict({"fc1": nn.Linear(features, 128),
                                    "fc2": nn.Linear(128, classes)})
    side = int(round(features ** 0.5))
    f = 4 if side >= 16 else 2  # weft-train pools after conv2 only for 16 x 16 and more
    return side, nn.ModuleDict({"conv1": nn.Conv2d(1, 32, 3, padding=1),
                                "conv2": nn.Conv2d(32, 64, 3, padding=1),
                                "fc1": nn.Linear(64 * (side // f) ** 2, 128),
                                "fc2": nn.Linear(128, classes)})


def forward(kind, m, x, side):
    if kind == "mlp":
        return m["fc2"](torch.relu(m["fc1"](x)))
    h = x.view(-1, 1, side, side)
    h = torch.max_pool2d(torch.relu(m["conv1"](h)), 2)
    h = torch.relu(m["conv2"](h))
    if side >= 16:
        h = torch.max_pool2d(h, 2)
    return m["fc2"](torch.relu(m["fc1"](h.flatten(1))))


def write_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().contiguous().numpy().tobytes() if hasattr(t, "numpy") else bytes(t)
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def optimizer(name, params, lr):
    if name == "sgd":
        return torch.optim.SGD(params, lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr, weight_decay=0.01)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr)
    raise SystemExit("unknown optimizer " + name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("weft_train")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--data-csv", default=None)
    ap.add_argument("--rtol", type=float, default=1e-4)
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    data = a.data_csv or os.path.join(here, "..", "examples", "weft-train", "data", "digits.csv.gz")
    torch.manual_seed(1234)
    torch.set_num_threads(1)
    x, y = prepare(*load_csv(data))
    classes = int(y.max()) + 1
    side, m = model(a.model, x.shape[1], classes)
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init.safetensors")
        log = os.path.join(tmp, "log.jsonl")
        write_safetensors(init, {k: v for k, v in m.state_dict().items()})
        opt = optimizer(a.optimizer, m.parameters(), a.lr)
        torch_losses = []
        n, b = len(y), a.batch
        per_epoch = (n + b - 1) // b
        for step in range(a.steps):
            at = (step % per_epoch) * b
            xb, yb = x[at: at + b], y[at: at + b]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(forward(a.model, m, xb, side), yb)
            loss.backward()
            opt.step()
            torch_losses.append(loss.item())
        cmd = [a.weft_train, "--quiet", "--init", init, "--no-shuffle", "--log", log,
               "--model", a.model, "--optimizer", a.optimizer, "--lr", str(a.lr),
               "--batch", str(b), "--steps", str(a.steps), "--data-csv", data]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        weft_losses = [json.loads(l)["loss"] for l in open(log) if '"eval"' not in l]
    worst, worst_step = 0.0, -1
    for s, (w, t) in enumerate(zip(weft_losses, torch_losses)):
        d = abs(w - t) / max(abs(t), 1e-6)
        if d > worst:
            worst, worst_step = d, s
    ok = len(weft_losses) == len(torch_losses) and worst <= a.rtol
    print(json.dumps({"bench": "loss_match_" + a.model + "_" + a.optimizer, "impl": "weft",
                      "peer": "pytorch", "steps": len(torch_losses),
                      "max_rel_diff": worst, "at_step": worst_step,
                      "first_losses": [round(v, 6) for v in weft_losses[:3]],
                      "pytorch_first_losses": [round(v, 6) for v in torch_losses[:3]],
                      "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
