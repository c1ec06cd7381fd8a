#!/usr/bin/env python3
"""tests/tools/test_resume.py: weft-train's checkpoints every K steps and --resume on real
runs, with a real SIGKILL (ctest runs each mode as its own test; see tests/CMakeLists.txt).

  mlp, eager, cnn, cnn-eager
             run A trains 2K steps without checkpoints and saves its weights; run B trains
             the same 2K steps with --checkpoint-every K and is SIGKILLed at a random moment
             after its checkpoint of step K is complete (the test checks that the kill, not
             the end of the run, stopped it); run C is B's command with --resume (and a log
             of its own). C's saved file (weights, Adam moments and step counter) must
             equal A's byte for byte, its log must start at a step >= K, and each loss it
             logs must equal A's of the same step (eager-init: all three start from the
             same --init file)
  options    --resume refuses a checkpoint of other options, naming the option (--lr, --hidden,
             --seed, --eager, and changed data via --test-fraction), and changes nothing;
             --resume in an empty folder starts at step 0; --keep N keeps N files

usage: test_resume.py MODE WEFT_TRAIN"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

from tooltest import check, read, run

# K per mode: each step count is large enough that the second half of a run takes a good
# fraction of a second on the 2-core CI machines (so that the kill lands inside it), small
# enough for the sanitizer builds.
MODES = {
    "mlp": (["--model", "mlp"], 2000),
    "eager": (["--model", "mlp", "--eager"], 300),
    "cnn": (["--model", "cnn"], 40),
    "cnn-eager": (["--model", "cnn", "--eager"], 40),
    # --init: the resumed values must replace the --init ones (an eager run keeps both lists)
    "eager-init": (["--model", "mlp", "--eager", "--init", "{init}"], 300),
}


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            if "eval" not in o:
                out[o["step"]] = o["loss"]
    return out


def ckpt_name(step):
    return f"ckpt-{step:012d}.safetensors"


def mode_kill(wt, tmp, extra, k):
    if "{init}" in extra:
        init = os.path.join(tmp, "init.safetensors")
        run([wt, "--quiet", "--steps", "10", "--seed", "5", "--save", init])
        extra = [init if x == "{init}" else x for x in extra]
    base = [wt, "--quiet", "--steps", str(2 * k)] + extra
    a_file, a_log = os.path.join(tmp, "a.safetensors"), os.path.join(tmp, "a.jsonl")
    run(base + ["--save", a_file, "--log", a_log])
    d = os.path.join(tmp, "ckpt")
    b = base + ["--checkpoint-every", str(k), "--checkpoint-dir", d, "--keep", "2",
                "--save", os.path.join(tmp, "c.safetensors")]
    p = subprocess.Popen(b + ["--log", os.path.join(tmp, "b.jsonl")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = os.path.join(d, ckpt_name(k))
    t0 = time.monotonic()
    while not os.path.exists(first) and p.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.001)
    # a random moment of the second half: K steps took about 'elapsed' (with the start-up),
    # so 0.3 of it ends well before step 2K
    time.sleep(random.uniform(0, 0.3 * (time.monotonic() - t0)))
    p.send_signal(signal.SIGKILL)
    rc = p.wait()
    print("killed:", rc, p.stderr.read().decode())
    check(rc == -signal.SIGKILL,
          f"the run ended with {rc} before the kill (make K larger for this machine)")
    check(not os.path.exists(os.path.join(tmp, "c.safetensors")), "B saved its final file")
    print("after the kill:", sorted(os.listdir(d)))
    c_log = os.path.join(tmp, "c.jsonl")
    run(b + ["--resume", "--log", c_log])
    check(read(os.path.join(tmp, "c.safetensors")) == read(a_file),
          "the resumed run's weights and optimizer state differ from the uninterrupted run's")
    # C's log begins at the step it resumed at (a step index: the steps done before it)
    c_losses, a_losses = losses(c_log), losses(a_log)
    resumed = min(c_losses) if c_losses else None
    check(resumed is not None and resumed >= k and max(c_losses) == 2 * k - 1,
          f"C's log does not run from a step >= {k} to {2 * k - 1}: {sorted(c_losses)[:3]}")
    for s in range(resumed, 2 * k):
        check(c_losses.get(s) == a_losses.get(s),
              f"step {s}: loss {c_losses.get(s)} after the resume, {a_losses.get(s)} without")
    print(f"ok: killed after step {k}'s checkpoint, resumed at step {resumed}, "
          f"{len(read(a_file))} bytes equal")


def mode_options(wt, tmp):
    d = os.path.join(tmp, "ckpt")
    base = [wt, "--steps", "40", "--checkpoint-every", "10", "--checkpoint-dir", d]
    r = run(base + ["--resume", "--keep", "2", "--save", os.path.join(tmp, "x.safetensors")])
    check("no checkpoint in" in r.stdout and "starting at step 0" in r.stdout,
          "--resume in an empty folder does not say it starts at step 0")
    names = sorted(os.listdir(d))
    check(names == [ckpt_name(30), ckpt_name(40)], f"--keep 2 left {names}")
    before = {n: read(os.path.join(d, n)) for n in names}
    for opt, bad in (("--lr", ["--lr", "0.01"]), ("--hidden", ["--hidden", "64"]),
                     ("--seed", ["--seed", "2"]), ("--eager", ["--eager"]),
                     ("--test-fraction", ["--test-fraction", "0.3"])):
        r = run(base + ["--resume"] + bad, expect=1)
        check(f"{opt}: the checkpoint was trained with" in r.stderr,
              f"a different {opt} is not named: {r.stderr}")
    after = {n: read(os.path.join(d, n)) for n in sorted(os.listdir(d))}
    check(after == before, "a refused resume changed the checkpoints")
    r = run([wt, "--resume"], expect=2)
    check("--resume needs --checkpoint-dir" in r.stderr, r.stderr)
    print("ok: mismatches named, empty folder starts at 0, --keep 2 keeps 2")


def main():
    if len(sys.argv) != 3 or (sys.argv[1] not in MODES and sys.argv[1] != "options"):
        print(__doc__)
        sys.exit(2)
    mode, wt = sys.argv[1], sys.argv[2]
    # In memory where there is a tmpfs: each checkpoint is fsynced, and on a disk that other
    # builds keep busy one fsync was seen to take tens of seconds (the kill waits for the
    # first checkpoint). What is tested, the kill and the resume, is the same on either.
    where = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="wf-resume-", dir=where) as tmp:
        if mode == "options":
            mode_options(wt, tmp)
        else:
            extra, k = MODES[mode]
            mode_kill(wt, tmp, extra, k)


if __name__ == "__main__":
    main()
