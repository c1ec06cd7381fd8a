#!/usr/bin/env python3
"""tests/tools/test_train_restarts.py: data-parallel weft-train under 'weft-run --restarts'
with real SIGKILLs: every restart resumes all ranks from the newest checkpoint, and the run
ends with the bytes of a run never stopped (ctest runs each mode as its own test; see
tests/CMakeLists.txt).

  single, ranks2, ranks3
             run A: 'weft-run -n N weft-train --strategy multiworker' trains S steps without
             checkpoints and saves its weights (with the Adam moments and step counter) and a
             log of its losses. Run B: the same under 'weft-run --restarts 5' with a checkpoint
             every K steps and --resume; five times, once the ranks of the current start have
             written a checkpoint of their own, the test SIGKILLs a random rank after a random
             part of K steps. B must show five restart lines of weft-run, each naming the
             killed rank and pid; rank 0 must say at each start after the first that all N
             ranks resumed from one checkpoint, at a step no older than the newest one
             complete before the kill; B's saved file must equal A's byte for byte, and every
             loss B logged (steps redone after a restart included) must equal A's of that
             step. 3 ranks do not divide the batch of 32 (shards of 11, 11 and 10 rows).
             single: one process without --strategy under 'weft-run -n 1 --restarts 5'.
             ps: parameter servers, 2 servers + 1 worker ('--strategy ps --ps-ranks 2'): each
             checkpoint gathers the two servers' shares of the weights and Adam moments to
             rank 0 (wf_session_ps_sync), every rank restores it; the worker (rank 2) prints,
             logs and saves.
             pipeline: 2 stages on 2 ranks, 4 micro-batches, 1F1B ('--strategy pipeline'):
             each checkpoint gathers stage 1's weights and Adam moments to rank 0, which
             writes it; every rank restores it.
  wrong      that the comparison catches a wrong resume: 2 ranks train 2K steps with
             checkpoints, then a copy of the newest checkpoint is made one step newer (the
             data position and step one ahead, the values unchanged: a resume whose data
             position is off by one); resuming from it must end with other bytes than A's
             and a loss that differs, while resuming from the true one gives A's bytes.
  disagree   ranks that would resume from other values fail together: rank r reads the
             folder D<r> (a shell between weft-run and weft-train); with one weight changed in
             rank 1's copy of the checkpoint every rank fails naming rank 1 and its other
             values, and with rank 1's copy missing every rank fails naming rank 1's load

usage: test_train_restarts.py MODE WEFT_RUN WEFT_TRAIN"""
import json
import os
import random
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

from tooltest import check, read, run

KILLS = 5
K = 25          # steps between checkpoints
STEPS = 16 * K  # each start trains at least K steps before its kill: 5 kills need about 5-10 K
# one process steps several times faster than the test polls and sleeps (a kill was seen to
# land 150 steps after the checkpoint it waited for): more steps, so that 5 kills fit
STEPS_SINGLE = 48 * K
OPTS = ["--hidden", "32", "--batch", "32", "--seed", "3", "--strategy", "multiworker"]


def losses(path):
    """{step: [losses logged for it]}; every line of the log must be whole JSON."""
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                o = json.loads(line)
            except ValueError:
                check(False, f"{path}:{n} is not a whole JSON line: {line!r}")
            if "eval" not in o:
                out.setdefault(o["step"], []).append(o["loss"])
    return out


def ckpt_steps(d):
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for n in names
                  if (m := re.fullmatch(r"ckpt-(\d+)\.safetensors", n)))


def rank_pids(wr_pid, n):
    """The pids of weft-run's ranks once all n of them run weft-train (else None)."""
    try:
        with open(f"/proc/{wr_pid}/task/{wr_pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        return None
    pids = []
    for k in kids:
        try:
            with open(f"/proc/{k}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):
            return None
        if b"--exec-rank" in argv or not any(a.endswith(b"weft-train") for a in argv[:1]):
            return None  # still weft-run's exec step
        pids.append(k)
    return pids if len(pids) == n else None


def reference(wr, wt, tmp, n, opts=OPTS, steps=STEPS):
    a_file, a_log = os.path.join(tmp, "a.safetensors"), os.path.join(tmp, "a.jsonl")
    r = run([wr, "-n", str(n), wt, "--steps", str(steps), "--save", a_file, "--log", a_log]
            + opts)
    m = re.search(r"(\d+) steps in ([0-9.]+) s", r.stdout)
    check(m is not None, "run A printed no step time")
    return a_file, losses(a_log), float(m.group(2)) / int(m.group(1)), r.wall


def mode_kills(wr, wt, tmp, n, opts=OPTS, steps=STEPS, writer=0):
    a_file, a_losses, step_s, a_wall = reference(wr, wt, tmp, n, opts, steps)
    d = os.path.join(tmp, "ckpt")
    b_file, b_log = os.path.join(tmp, "b.safetensors"), os.path.join(tmp, "b.jsonl")
    cmd = [wr, "-n", str(n), "--restarts", str(KILLS), wt, "--steps", str(steps),
           "--checkpoint-every", str(K), "--checkpoint-dir", d, "--keep", "2", "--resume",
           "--save", b_file, "--log", b_log] + opts
    print("$", " ".join(cmd), flush=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    reader = threading.Thread(target=lambda: out.extend(p.stdout), daemon=True)
    reader.start()
    kills = []  # (rank, pid, newest checkpoint step before the kill)
    old = set()
    # past it the run hangs: the whole run A took, (1 + KILLS) times over, and a margin for
    # the detection and the restarts (a sanitizer build is 5-20 times slower)
    limit = 60 + 4 * (1 + KILLS) * a_wall
    deadline = time.monotonic() + limit
    while len(kills) < KILLS and p.poll() is None and time.monotonic() < deadline:
        pids = rank_pids(p.pid, n)
        if pids is None or old & set(pids):
            time.sleep(0.002)
            continue
        # this start's ranks: wait until they wrote a checkpoint of their own
        base = max(ckpt_steps(d), default=0)
        while p.poll() is None and time.monotonic() < deadline and \
                max(ckpt_steps(d), default=0) <= base:
            time.sleep(0.002)
        if p.poll() is not None:
            break
        # a random step of the next K (a random rank): the kill may come while rank 0 writes
        time.sleep(random.uniform(0, K * step_s))
        newest = max(ckpt_steps(d), default=0)
        rank = random.randrange(n)
        try:
            os.kill(pids[rank], signal.SIGKILL)
        except ProcessLookupError:
            break  # the run ended meanwhile
        kills.append((rank, pids[rank], newest))
        print(f"test: SIGKILL rank {rank} (pid {pids[rank]}), newest checkpoint step {newest}",
              flush=True)
        old = set(pids)
    try:
        rc = p.wait(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        check(False, f"HANG: weft-run --restarts did not end within {limit:.0f} s")
    reader.join(10)
    text = "".join(out)
    print(text, flush=True)
    check(len(kills) == KILLS,
          f"the run ended after {len(kills)} of {KILLS} kills (make STEPS larger)")
    check(rc == 0, f"weft-run --restarts exited with {rc}")
    restarts = re.findall(r"weft-run: restart (\d+) of \d+ \(incarnation \d+\): rank (\d+) "
                          r"\(pid (\d+)\) was killed by signal 9", text)
    check([(int(i), int(r), int(pid)) for i, r, pid in restarts] ==
          [(i + 1, r, pid) for i, (r, pid, _) in enumerate(kills)],
          f"weft-run's restart lines {restarts} do not name the kills {kills}")
    on_all = f" on all {n} ranks" if n > 1 else "\n"
    resumed = [int(s) for s in re.findall(
        rf"\[{writer}\] weft-train: resuming from \S+ \(step (\d+)\){on_all}", text)]
    check(len(resumed) == KILLS and "no checkpoint in" in text,
          f"expected a fresh start then {KILLS} resumes ({on_all.strip()}), saw {resumed}")
    for (rank, pid, newest), st in zip(kills, resumed):
        check(st >= newest and st % K == 0,
              f"a restart after the kill of rank {rank} resumed at step {st}, but step "
              f"{newest}'s checkpoint was complete before it")
    check(read(b_file) == read(a_file),
          "the restarted run's weights and optimizer state differ from the uninterrupted run's")
    b_losses = losses(b_log)
    check(sorted(b_losses) == list(range(steps)), "B's log does not cover every step")
    for s, ls in b_losses.items():
        check(all(x == a_losses[s][0] for x in ls),
              f"step {s}: losses {ls} in the restarted run, {a_losses[s][0]} without")
    redone = sum(len(ls) - 1 for ls in b_losses.values())
    print(f"ok: {n} ranks, {KILLS} kills (ranks {[k[0] for k in kills]}), resumed at steps "
          f"{resumed}, {redone} steps redone, {len(read(a_file))} bytes equal", flush=True)


def shift_checkpoint(src, dst, by):
    """Writes a copy of checkpoint 'src' whose step and data position are 'by' steps later."""
    data = read(src)
    (hn,) = struct.unpack("<Q", data[:8])
    head = json.loads(data[8:8 + hn])
    body = bytearray(data[8 + hn:])
    step = int(head["__metadata__"]["weft.step"]) + by
    head["__metadata__"]["weft.step"] = str(step)
    lo, hi = head["weft-train.position"]["data_offsets"]
    check(head["weft-train.position"]["dtype"] == "I64" and hi - lo == 32,
          "the checkpoint has no I64 [4] data position")
    pos = list(struct.unpack("<4q", body[lo:hi]))
    pos[0] = step
    body[lo:hi] = struct.pack("<4q", *pos)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + bytes(body))
    return step


def mode_wrong(wr, wt, tmp):
    n = 2
    a_file, a_losses, _, _ = reference(wr, wt, tmp, n)
    d = os.path.join(tmp, "ckpt")
    run([wr, "-n", str(n), wt, "--steps", str(2 * K), "--checkpoint-every", str(K),
         "--checkpoint-dir", d] + OPTS)
    check(ckpt_steps(d) == [K, 2 * K], f"checkpoints {ckpt_steps(d)}")
    resume = [wr, "-n", str(n), "--restarts", "1", wt, "--steps", str(STEPS),
              "--checkpoint-every", str(K), "--checkpoint-dir", d, "--resume"] + OPTS
    # the true newest, in a copy of the folder
    d2 = os.path.join(tmp, "ckpt-true")
    os.mkdir(d2)
    src = os.path.join(d, f"ckpt-{2 * K:012d}.safetensors")
    with open(os.path.join(d2, os.path.basename(src)), "wb") as f:
        f.write(read(src))
    good = os.path.join(tmp, "good.safetensors")
    resume_true = resume[:resume.index(d)] + [d2] + resume[resume.index(d) + 1:]
    r = run(resume_true + ["--save", good])
    check(f"(step {2 * K}) on all {n} ranks" in r.stdout, "the true resume did not say its step")
    check(read(good) == read(a_file), "resuming from the true checkpoint changed the bytes")
    # one step ahead
    step = shift_checkpoint(src, os.path.join(d, f"ckpt-{2 * K + 1:012d}.safetensors"), 1)
    bad, bad_log = os.path.join(tmp, "bad.safetensors"), os.path.join(tmp, "bad.jsonl")
    r = run(resume + ["--save", bad, "--log", bad_log])
    check(f"(step {step}) on all {n} ranks" in r.stdout, "the shifted checkpoint was not used")
    check(read(bad) != read(a_file), "a resume one step off gave the uninterrupted bytes")
    bl = losses(bad_log)
    check(any(bl[s][0] != a_losses[s][0] for s in bl),
          "a resume one step off logged the uninterrupted losses")
    print(f"ok: resuming at step {step} instead of {2 * K} is caught (other bytes and losses); "
          f"the true checkpoint gives the uninterrupted bytes")


def mode_disagree(wr, wt, tmp):
    n = 2
    d0, d1 = os.path.join(tmp, "D0"), os.path.join(tmp, "D1")
    run([wr, "-n", str(n), wt, "--steps", str(K), "--checkpoint-every", str(K),
         "--checkpoint-dir", d0] + OPTS)
    name = f"ckpt-{K:012d}.safetensors"
    data = bytearray(read(os.path.join(d0, name)))
    (hn,) = struct.unpack("<Q", data[:8])
    head = json.loads(data[8:8 + hn])
    lo, _ = head["fc1.weight"]["data_offsets"]
    data[8 + hn + lo] ^= 1  # the lowest bit of one weight: a valid file of other values
    os.mkdir(d1)
    with open(os.path.join(d1, name), "wb") as f:
        f.write(data)
    # rank r resumes from D<r>; the rest of the command is the same on every rank
    sh = ("exec \"$0\" \"$@\" --checkpoint-dir " + os.path.join(tmp, "D") + "$WEFT_RANK")
    cmd = [wr, "-n", str(n), "/bin/sh", "-c", sh, wt, "--steps", str(2 * K), "--resume"] + OPTS
    r = run(cmd, expect=1)
    for rank in range(n):
        check(f"[{rank}] weft-train: --resume" in r.stdout + r.stderr and
              re.search(rf"\[{rank}\] weft-train: --resume \S+: rank \d read other values",
                        r.stdout + r.stderr), f"rank {rank} did not name the other values")
    check("rank 1 read other values" in r.stdout + r.stderr, "rank 0 did not name rank 1")
    os.remove(os.path.join(d1, name))
    r = run(cmd, expect=1)
    check(f"[0] weft-train: --resume {os.path.join(d0, name)}: rank 1 could not load it"
          in r.stdout + r.stderr, "rank 0 did not name rank 1's failed load")
    check(re.search(r"\[1\] weft-train: --resume \S+D1/" + name, r.stdout + r.stderr),
          "rank 1 did not say which file it could not load")
    print("ok: other values and a missing file on rank 1 fail every rank, naming rank 1")


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("single", "ranks2", "ranks3", "ps", "pipeline",
                                                 "wrong", "disagree"):
        print(__doc__)
        sys.exit(2)
    mode, wr, wt = sys.argv[1:]
    seed = int(os.environ.get("WF_TEST_SEED", time.time_ns() % 1000000))
    random.seed(seed)
    print(f"test: seed {seed} (WF_TEST_SEED={seed} repeats the choice of ranks and delays)")
    # in memory where there is a tmpfs: each checkpoint is fsynced (test_resume.py says why)
    where = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="wf-restarts-", dir=where) as tmp:
        if mode == "wrong":
            mode_wrong(wr, wt, tmp)
        elif mode == "disagree":
            mode_disagree(wr, wt, tmp)
        elif mode == "single":  # the options but --strategy
            mode_kills(wr, wt, tmp, 1, OPTS[:OPTS.index("--strategy")], STEPS_SINGLE)
        elif mode == "ps":  # 2 servers + 1 worker
            opts = OPTS[:OPTS.index("--strategy")] + ["--strategy", "ps", "--ps-ranks", "2"]
            mode_kills(wr, wt, tmp, 3, opts, writer=2)
        elif mode == "pipeline":  # 2 stages, 4 micro-batches of 8 rows
            opts = OPTS[:OPTS.index("--strategy")] + ["--strategy", "pipeline",
                                                      "--micro-batches", "4"]
            mode_kills(wr, wt, tmp, 2, opts)
        else:
            mode_kills(wr, wt, tmp, int(mode[-1]))


if __name__ == "__main__":
    main()
