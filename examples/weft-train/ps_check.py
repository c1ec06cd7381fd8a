#!/usr/bin/env python3
"""examples/weft-train/ps_check.py: synchronous parameter servers in weft-train give the bits
of multiworker over as many ranks as there are workers: runs
'weft-run -n K+W weft-train ARGS --strategy ps --ps-ranks K --save a' and
'weft-run -n W weft-train ARGS --strategy multiworker --save b', and fails unless both exit 0
and every model weight of a (the tensors without a '/' in their name; a worker's optimizer
state is not the servers') has the bytes of b's. Standard library only.
Usage: ps_check.py WEFT_RUN WEFT_TRAIN K W [ARGS...]"""
import json
import struct
import subprocess
import sys


def tensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], body[lo:hi])
    return out


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    sys.stdout.write(p.stdout + p.stderr)
    if p.returncode != 0:
        sys.exit(f"ps_check: {' '.join(cmd)} exited with {p.returncode}")


def main():
    weft_run, exe, k, w = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    args = sys.argv[5:]
    a, b = f"wt-ps-{k}x{w}.safetensors", f"wt-ps-mw-{w}.safetensors"
    run([weft_run, "-n", str(k + w), exe, *args, "--strategy", "ps", "--ps-ranks", str(k),
         "--save", a])
    run([weft_run, "-n", str(w), exe, *args, "--strategy", "multiworker", "--save", b])
    ta, tb = tensors(a), tensors(b)
    weights = sorted(n for n in tb if "/" not in n)
    if not weights:
        sys.exit("ps_check: no weights in " + b)
    for n in weights:
        if n not in ta:
            sys.exit(f"ps_check: {a} has no {n}")
        if ta[n] != tb[n]:
            sys.exit(f"ps_check: {n} differs between {k} servers + {w} workers and "
                     f"multiworker over {w} ranks")
    print(f"ps_check: {k} servers + {w} workers and multiworker over {w} ranks: the same bytes "
          f"of {len(weights)} weights ({', '.join(weights)})")


if __name__ == "__main__":
    main()
