#!/usr/bin/env python3
"""examples/train_gpt/pp_check.py: train_gpt's pipeline gives the bits of multiworker with as
many shards as micro-batches on one rank, and losses within 1e-6 relative of plain training:
runs 'weft-run -n P train_gpt ARGS --strategy pipeline --micro-batches M PIPE_ARGS --save a
--log a', 'train_gpt ARGS --strategy multiworker --shards M --save b --log b' and
'train_gpt ARGS --log c', and fails unless all exit 0, a and b are the same bytes (every
variable: weights, AdamW state, step counters; rank 0 gathers the other stages' before it
saves), their per-step losses are equal, and each is within 1e-6 relative of c's.
Standard library only.
Usage: pp_check.py WEFT_RUN TRAIN_GPT P M TAG [ARGS...] -- [PIPE_ARGS...]"""
import json
import subprocess
import sys


def run(cmd):
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(p.stdout, flush=True)
    if p.returncode != 0:
        sys.exit("%s exited with %d" % (cmd[0], p.returncode))


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def main():
    run_exe, exe, ranks, micro, tag = sys.argv[1:6]
    rest = sys.argv[6:]
    cut = rest.index("--") if "--" in rest else len(rest)
    args, pipe = rest[:cut], rest[cut + 1:]
    a, b, c = tag + "-pipe", tag + "-one", tag + "-plain"
    run([run_exe, "-n", ranks, exe] + args + ["--strategy", "pipeline", "--micro-batches", micro] +
        pipe + ["--save", a + ".safetensors", "--log", a + ".jsonl"])
    run([exe] + args + ["--strategy", "multiworker", "--shards", micro, "--save",
                        b + ".safetensors", "--log", b + ".jsonl"])
    run([exe] + args + ["--log", c + ".jsonl"])
    with open(a + ".safetensors", "rb") as f:
        da = f.read()
    with open(b + ".safetensors", "rb") as f:
        db = f.read()
    if da != db:
        sys.exit("%s ranks (pipeline, m = %s) saved other bytes than 1 rank x %s shards" %
                 (ranks, micro, micro))
    la, lb, lc = losses(a + ".jsonl"), losses(b + ".jsonl"), losses(c + ".jsonl")
    if not la or la != lb or len(la) != len(lc):
        sys.exit("losses: pipeline %s, multiworker %s, plain %s" % (la, lb, lc))
    worst = 0.0
    for step, (x, y) in enumerate(zip(la, lc)):
        rel = abs(x - y) / abs(y)
        worst = max(worst, rel)
        if rel > 1e-6:
            sys.exit("step %d: pipeline loss %.9g, plain %.9g (%.3g relative)" % (step, x, y, rel))
    print("%s ranks (pipeline, m = %s %s) and 1 rank x %s shards: the same checkpoint bytes and "
          "losses; %d losses within %.3g relative of plain training" %
          (ranks, micro, " ".join(pipe), micro, len(la), worst))


if __name__ == "__main__":
    main()
