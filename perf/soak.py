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
# Usage: perf/soak.sh [--short] [--build DIR] [--duration S] [--events N] [--seed N]
#   full: 600 s and up to 12 events; --short (CI): 45 s and 3 events (kill, stop, kill).
# Exit: 0 passed, 1 a check failed (the line says which), 2 usage.
import argparse
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
    """weft-run with its output lines, each stamped with time.monotonic() on arrival."""

    def __init__(self, cmd):
        self.lines = []
        self.pids = {}    # rank -> pid of its current start
        self.starts = 0   # "rank R pid P start S" lines seen
        self.cv = threading.Condition()
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, text=True, bufsize=1)
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self):
        for line in self.p.stdout:
            line = line.rstrip("\n")
            now = time.monotonic()
            m = re.match(r"\[(\d+)\] rank \1 pid (\d+) start (\d+)$", line)
            with self.cv:
                self.lines.append((now, line))
                if m:
                    self.pids[int(m.group(1))] = int(m.group(2))
                    self.starts += 1
                self.cv.notify_all()

    def wait_starts(self, n, deadline):
        with self.cv:
            while self.starts < n and self.p.poll() is None and time.monotonic() < deadline:
                self.cv.wait(0.2)
            return self.starts >= n


def main():
    a = parse_args()
    rng = random.Random(a.seed)
    wr = os.path.join(a.build, "tools", "weft-run")
    rt = os.path.join(a.build, "tests", "restart_train")
    for exe in (wr, rt):
        if not os.access(exe, os.X_OK):
            fail(f"{exe} is not built")
    # Steps for about 3/4 of the time at ~12 ms a step, the rest for the events.
    steps = max(4 * EVERY, int(a.duration * 0.75 / ((STEP_MS + 2) / 1000.0)))
    steps -= steps % EVERY
    print(f"soak: {RANKS} ranks, {steps} steps of ~{STEP_MS} ms, checkpoint every {EVERY}, "
          f"up to {a.events} events in {a.duration:.0f} s, seed {a.seed}", flush=True)
    tmp = tempfile.mkdtemp(prefix="wf-soak.")
    ref_dir, dir_ = os.path.join(tmp, "ref"), os.path.join(tmp, "soak")
    os.mkdir(ref_dir)
    os.mkdir(dir_)

    # The uninterrupted run (no sleep: the sleep changes no bit, only the time).
    t = time.monotonic()
    ref = subprocess.run([wr, "-n", str(RANKS), "--", rt, "--dir", ref_dir, "--steps",
                          str(steps), "--every", str(EVERY)], capture_output=True, text=True,
                         timeout=a.duration * 2 + 60)
    if ref.returncode != 0:
        fail(f"the uninterrupted run exited {ref.returncode}:\n{ref.stdout}{ref.stderr}")
    want = hashes([(0, l) for l in ref.stdout.splitlines()])
    print(f"soak: uninterrupted run: {time.monotonic() - t:.1f} s, hash {want.get(0)}",
          flush=True)

    deadline_s = a.duration * 2 + 120  # past it the run is a hang
    run = Run([wr, "-n", str(RANKS), "--restarts", str(a.events + 2), "--", rt, "--dir", dir_,
               "--steps", str(steps), "--every", str(EVERY), "--step-ms", str(STEP_MS)])
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
    saves = [(tt, int(m.group(1))) for tt, l in lines
             if (m := re.match(r"\[0\] rank 0 saved step (\d+)$", l))]
    start_lines = [tt for tt, l in lines if re.match(r"\[\d+\] rank \d+ pid \d+ start \d+$", l)]
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
    for r in range(RANKS):
        if r not in want or got.get(r) != want[r]:
            fail(f"rank {r}: final hash {got.get(r)}, uninterrupted {want.get(r)}")
    with open(os.path.join(ref_dir, "final.safetensors"), "rb") as f1, \
            open(os.path.join(dir_, "final.safetensors"), "rb") as f2:
        if f1.read() != f2.read():
            fail("the final checkpoint differs from the uninterrupted run's")
    for name in ("ckpt.safetensors", "final.safetensors"):
        bad = check_safetensors(os.path.join(dir_, name))
        if bad:
            fail(f"{name} is corrupt: {bad}")
    stale = [n for n in os.listdir(dir_) if ".tmp." in n]
    if stale:
        fail(f"temporary files left: {stale}")
    subprocess.run(["rm", "-rf", tmp])
    print(f"soak: ok: {len(restarts)} restarts, final weights equal the uninterrupted run's "
          f"(hash {want[0]}), checkpoints whole, no hang")


if __name__ == "__main__":
    main()
