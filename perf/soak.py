#!/usr/bin/python3
# perf/soak.py: the soak of weft-run --restarts (run it through perf/soak.sh). Three ranks
# of restart_train (data-parallel training, one all-reduce per step, a checkpoint every 50
# steps) run under 'weft-run -n 3 --restarts R' on loopback for a bounded time, while this
# driver SIGKILLs or SIGSTOPs a random rank of the current start at random times (a bounded
# count). A SIGSTOPped rank is found by its peers' heartbeat deadline (10 s), a killed one at
# once; weft-run ends the rest and starts all three again from the newest checkpoint.
# Checks: no hang (the run ends before its deadline), the checkpoint file is whole
# (safetensors header and offsets) and no stale temporary file is left, and the final
# weights equal an uninterrupted run's (every rank's hash, and the final checkpoint's bytes).
# Reports: each event and its restart (time to detect, to start again, and the work done
# since the last checkpoint, which is redone), the time lost per restart (wall time minus
# steps x the measured step time), and the verdict lines: weft-run's restart lines and the
# ranks' own lines naming the failed peer.
# --program weft-train: the same soak of the real trainer instead, 'weft-train --strategy
# multiworker --checkpoint-every 50 --checkpoint-dir D --resume' (an MLP on the bundled digits;
# rank 0 writes the checkpoints, every rank resumes from the one rank 0 picks). weft-train
# prints no pids or saves, so the driver reads them from outside: the ranks are weft-run's
# children (/proc), a save is a new ckpt-<step>.safetensors in D, and a start is complete
# when rank 0 says every rank resumed (or that there is no checkpoint yet); the final weights are
# compared as the bytes of rank 0's --save file with an uninterrupted run's, and every
# checkpoint left in D must be whole.
# Usage: perf/soak.sh [--short] [--build DIR] [--duration S] [--events N] [--seed N]
#                     [--program restart_train|weft-train]
#   full: 600 s and up to 12 events; --short (CI): 45 s and 3 events (kill, stop, kill).
# Exit: 0 passed, 1 a check failed (the line says which), 2 usage.
import argparse
import hashlib
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

RANKS = 3
EVERY = 50
STEP_MS = 10


def parse_args():
    ap = argparse.ArgumentParser(description="weft-run --restarts soak")
    ap.add_argument("--build", default=os.environ.get("WF_BUILD_DIR", "build"))
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--duration", type=float)
    ap.add_argument("--events", type=int)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--program", choices=["restart_train", "weft-train"],
                    default="restart_train")
    a = ap.parse_args()
    a.duration = a.duration or (45.0 if a.short else 600.0)
    a.events = a.events if a.events is not None else (3 if a.short else 12)
    return a


def fail(msg):
    print(f"soak: FAILED: {msg}", flush=True)
    sys.exit(1)


def hashes(lines):
    out = {}
    for _, line in lines:
        m = re.match(r"\[(\d+)\] rank \1 final step \d+ hash ([0-9a-f]+)$", line)
        if m:
            out[int(m.group(1))] = m.group(2)
    return out


def check_safetensors(path):
    """Whether 'path' is a whole safetensors file: header length, JSON, offsets in range."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        return "shorter than 8 bytes"
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        return f"header of {n} bytes in a file of {len(data)}"
    try:
        head = json.loads(data[8:8 + n])
    except ValueError as e:
        return f"header is not JSON: {e}"
    body = len(data) - 8 - n
    for name, t in head.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        if not 0 <= lo <= hi <= body:
            return f"tensor {name}: offsets [{lo}, {hi}] outside {body} bytes"
    return None


class Run:
    """weft-run with its output lines, each stamped with time.monotonic() on arrival. With
    'ckpt_dir' (weft-train) the ranks' pids and the saves are watched from outside instead."""

    def __init__(self, cmd, ckpt_dir=None):
        self.lines = []
        self.pids = {}    # rank -> pid of its current start
        self.starts = 0   # "rank R pid P start S" lines seen (or ranks seen started)
        self.start_times = []  # when each rank start was seen
        self.saves = []   # (time, step) of each checkpoint seen complete
        self.cv = threading.Condition()
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, text=True, bufsize=1)
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()
        if ckpt_dir:
            self.watcher = threading.Thread(target=self.watch, args=(ckpt_dir,), daemon=True)
            self.watcher.start()

    def watch(self, d):
        """Every 5 ms: a new full set of weft-train ranks is a start of all of them (whose
        pids the events may signal); a new ckpt-<step>.safetensors (renamed into place:
        complete) is a save."""
        seen_pids, seen_files = set(), set()
        while self.p.poll() is None:
            pids = rank_pids(self.p.pid, RANKS)
            now = time.monotonic()
            if pids and not seen_pids & set(pids):
                seen_pids |= set(pids)
                with self.cv:
                    self.pids = dict(enumerate(pids))
                    self.starts += RANKS
                    self.cv.notify_all()
            try:
                names = os.listdir(d)
            except FileNotFoundError:
                names = []
            for n in names:
                m = re.fullmatch(r"ckpt-(\d+)\.safetensors", n)
                if m and n not in seen_files:
                    seen_files.add(n)
                    with self.cv:
                        self.saves.append((now, int(m.group(1))))
            time.sleep(0.005)

    def read(self):
        for line in self.p.stdout:
            line = line.rstrip("\n")
            now = time.monotonic()
            m = re.match(r"\[(\d+)\] rank \1 pid (\d+) start (\d+)$", line)
            s = re.match(r"\[0\] rank 0 saved step (\d+)$", line)
            # weft-train: rank 0 says so once every rank has resumed (or found nothing)
            w = re.match(r"\[0\] weft-train: (resuming from \S+ \(step \d+\) on all|--resume: "
                         r"no checkpoint)", line)
            with self.cv:
                self.lines.append((now, line))
                if m:
                    self.pids[int(m.group(1))] = int(m.group(2))
                    self.starts += 1
                    self.start_times.append(now)
                if w:
                    self.start_times += [now] * RANKS
                if s:
                    self.saves.append((now, int(s.group(1))))
                self.cv.notify_all()

    def wait_starts(self, n, deadline):
        with self.cv:
            while self.starts < n and self.p.poll() is None and time.monotonic() < deadline:
                self.cv.wait(0.2)
            return self.starts >= n


def rank_pids(wr_pid, n):
    """The pids of weft-run's n ranks once all of them run the program (else None)."""
    try:
        with open(f"/proc/{wr_pid}/task/{wr_pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
        for k in kids:
            with open(f"/proc/{k}/cmdline", "rb") as f:
                if b"--exec-rank" in f.read().split(b"\0"):
                    return None  # still weft-run's own exec step
    except (FileNotFoundError, ProcessLookupError):
        return None
    return kids if len(kids) == n else None


def file_hash(path):
    return hashlib.sha256(read_bytes(path)).hexdigest()[:16]


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


# weft-train's options of the soak: a small MLP, one weft worker per rank (3 ranks share 2
# cores here), --batch 32 over 3 shards (11, 11 and 10 rows)
WT_OPTS = ["--hidden", "32", "--batch", "32", "--threads", "1", "--strategy", "multiworker"]


def main():
    a = parse_args()
    rng = random.Random(a.seed)
    wr = os.path.join(a.build, "tools", "weft-run")
    wt = a.program == "weft-train"
    rt = os.path.join(a.build, "examples", "weft-train", "weft-train") if wt else \
        os.path.join(a.build, "tests", "restart_train")
    for exe in (wr, rt):
        if not os.access(exe, os.X_OK):
            fail(f"{exe} is not built")
    tmp = tempfile.mkdtemp(prefix="wf-soak.")
    ref_dir, dir_ = os.path.join(tmp, "ref"), os.path.join(tmp, "soak")
    os.mkdir(ref_dir)
    os.mkdir(dir_)
    ckpt_dir = os.path.join(dir_, "ckpt") if wt else None
    if wt:  # the step time of this machine now, from a short run
        cal = subprocess.run([wr, "-n", str(RANKS), rt, "--quiet", "--steps", "300"] + WT_OPTS,
                             capture_output=True, text=True, timeout=600)
        m = re.search(r"(\d+) steps in ([0-9.]+) s", cal.stdout)
        if cal.returncode != 0 or not m:
            fail(f"the calibration run exited {cal.returncode}:\n{cal.stdout}{cal.stderr}")
        step_ms = 1000 * float(m.group(2)) / int(m.group(1))
    else:
        step_ms = STEP_MS + 2  # the sleep and ~2 ms of work
    # Steps for about 3/4 of the time, the rest for the events.
    steps = max(4 * EVERY, int(a.duration * 0.75 / (step_ms / 1000.0)))
    steps -= steps % EVERY
    print(f"soak: {RANKS} ranks of {a.program}, {steps} steps of ~{step_ms:.1f} ms, checkpoint "
          f"every {EVERY}, up to {a.events} events in {a.duration:.0f} s, seed {a.seed}",
          flush=True)

    # The uninterrupted run (no sleep: the sleep changes no bit, only the time).
    t = time.monotonic()
    if wt:
        ref_cmd = [wr, "-n", str(RANKS), rt, "--quiet", "--steps", str(steps), "--save",
                   os.path.join(ref_dir, "final.safetensors")] + WT_OPTS
    else:
        ref_cmd = [wr, "-n", str(RANKS), "--", rt, "--dir", ref_dir, "--steps", str(steps),
                   "--every", str(EVERY)]
    ref = subprocess.run(ref_cmd, capture_output=True, text=True, timeout=a.duration * 2 + 60)
    if ref.returncode != 0:
        fail(f"the uninterrupted run exited {ref.returncode}:\n{ref.stdout}{ref.stderr}")
    want = hashes([(0, l) for l in ref.stdout.splitlines()])
    if wt:
        want = {0: file_hash(os.path.join(ref_dir, "final.safetensors"))}
    print(f"soak: uninterrupted run: {time.monotonic() - t:.1f} s, hash {want.get(0)}",
          flush=True)

    deadline_s = a.duration * 2 + 120  # past it the run is a hang
    if wt:
        run = Run([wr, "-n", str(RANKS), "--restarts", str(a.events + 2), rt, "--steps",
                   str(steps), "--checkpoint-every", str(EVERY), "--checkpoint-dir", ckpt_dir,
                   "--resume", "--save", os.path.join(dir_, "final.safetensors")] + WT_OPTS,
                  ckpt_dir)
    else:
        run = Run([wr, "-n", str(RANKS), "--restarts", str(a.events + 2), "--", rt, "--dir",
                   dir_, "--steps", str(steps), "--every", str(EVERY), "--step-ms",
                   str(STEP_MS)])
    events = []  # (t, rank, pid, signal name)
    kinds = ["KILL", "STOP", "KILL"] if a.short else None
    end_events = run.t0 + a.duration * 0.8
    started = RANKS
    while len(events) < a.events and run.p.poll() is None:
        if not run.wait_starts(started, run.t0 + deadline_s):
            break
        gap = rng.uniform(2.0, 6.0) if a.short else rng.uniform(5.0, 60.0)
        if time.monotonic() + gap > end_events:
            break
        time.sleep(gap)
        if run.p.poll() is not None:
            break
        kind = kinds[len(events)] if kinds else rng.choice(["KILL", "KILL", "STOP"])
        rank = rng.randrange(RANKS)
        with run.cv:
            pid = run.pids[rank]
        try:
            os.kill(pid, getattr(signal, "SIG" + kind))
        except ProcessLookupError:
            continue
        events.append((time.monotonic(), rank, pid, kind))
        print(f"soak: {time.monotonic() - run.t0:7.2f} s: SIG{kind} rank {rank} (pid {pid})",
              flush=True)
        started += RANKS  # the next event waits for the next start
    try:
        code = run.p.wait(timeout=max(1.0, run.t0 + deadline_s - time.monotonic()))
    except subprocess.TimeoutExpired:
        run.p.kill()  # its ranks go with it (parent-death signal)
        run.p.wait()
        fail(f"HANG: weft-run still ran {deadline_s:.0f} s after its start")
    run.reader.join(5)
    if wt:
        run.watcher.join(5)
    wall = time.monotonic() - run.t0
    lines = run.lines

    # Verdict lines: weft-run's, and what the ranks said about the failed peer.
    verdicts = [l for _, l in lines if l.startswith("weft-run:") or
                re.search(r"died|silent|timed out|left the comm|EPEER", l)]
    print("soak: verdict lines:")
    for l in verdicts:
        print("  " + l)

    # Per event: detection, restart and redone work.
    restarts = [(tt, l) for tt, l in lines if l.startswith("weft-run: restart ")]
    saves, start_lines = run.saves, run.start_times
    # One step's time: consecutive saves of one start (no restart between them).
    gaps = []
    for (t1, s1), (t2, s2) in zip(saves, saves[1:]):
        if s2 == s1 + EVERY and not any(t1 < tr < t2 for tr, _ in restarts):
            gaps.append((t2 - t1) / EVERY)
    gaps.sort()
    step_s = gaps[len(gaps) // 2] if gaps else float("nan")
    print(f"soak: {len(events)} events, {len(restarts)} restarts, wall {wall:.1f} s, "
          f"step {step_s * 1000:.2f} ms (median of {len(gaps)} checkpoint intervals)")
    for i, (te, rank, pid, kind) in enumerate(events):
        tr = next((tt for tt, _ in restarts if tt >= te), None)
        if tr is None:
            print(f"  event {i + 1}: SIG{kind} rank {rank}: no restart followed")
            continue
        ts = [tt for tt in start_lines if tt > tr][:RANKS]
        back = ts[-1] - tr if len(ts) == RANKS else float("nan")
        last_save = max((tt for tt, _ in saves if tt <= te), default=run.t0)
        redo = te - last_save
        print(f"  event {i + 1}: SIG{kind} rank {rank}: detected {tr - te:.3f} s, all ranks "
              f"started again {back:.3f} s later, {redo:.3f} s of work since the last "
              f"checkpoint redone: {tr - te + back + redo:.3f} s lost")
    lost = wall - steps * step_s
    if restarts:
        print(f"soak: time lost {lost:.1f} s in all (wall - {steps} steps x {step_s * 1000:.2f} "
              f"ms), {lost / len(restarts):.2f} s per restart")

    # Checks.
    if code != 0:
        fail(f"weft-run exited {code}")
    if len(restarts) < len(events):
        fail(f"{len(events)} events but {len(restarts)} restarts")
    got = hashes(lines)
    for r in range(RANKS if not wt else 0):
        if r not in want or got.get(r) != want[r]:
            fail(f"rank {r}: final hash {got.get(r)}, uninterrupted {want.get(r)}")
    with open(os.path.join(ref_dir, "final.safetensors"), "rb") as f1, \
            open(os.path.join(dir_, "final.safetensors"), "rb") as f2:
        if f1.read() != f2.read():
            fail("the final checkpoint differs from the uninterrupted run's")
    check_dir = ckpt_dir if wt else dir_
    names = ["final.safetensors"] + (["ckpt.safetensors"] if not wt else [])
    names = [os.path.join(dir_, n) for n in names]
    if wt:
        names += [os.path.join(ckpt_dir, n) for n in sorted(os.listdir(ckpt_dir))
                  if re.fullmatch(r"ckpt-\d+\.safetensors", n)]
    for path in names:
        bad = check_safetensors(path)
        if bad:
            fail(f"{os.path.basename(path)} is corrupt: {bad}")
    stale = [n for n in os.listdir(check_dir) if ".tmp." in n]
    if stale:
        fail(f"temporary files left: {stale}")
    subprocess.run(["rm", "-rf", tmp])
    print(f"soak: ok: {len(restarts)} restarts, final weights equal the uninterrupted run's "
          f"(hash {want[0]}), checkpoints whole, no hang")


if __name__ == "__main__":
    main()
