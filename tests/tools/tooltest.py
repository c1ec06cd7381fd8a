"""tests/tools/tooltest.py: the helpers the weft-train tool tests share (test_resume.py,
test_train_restarts.py): failing with a message, running a command that must exit with a
given status (printing its output, timing it), and reading a file's bytes."""
import subprocess
import sys
import time


def check(cond, msg):
    if not cond:
        print("FAIL:", msg, flush=True)
        sys.exit(1)


def run(cmd, expect=0, timeout=600):
    """Runs 'cmd', prints it and its output, and fails unless it exits with 'expect'. The
    result has the wall time in seconds as 'wall'."""
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    r.wall = time.monotonic() - t0
    print("$", " ".join(cmd))
    print(r.stdout, r.stderr, flush=True)
    check(r.returncode == expect, f"exited with {r.returncode}, expected {expect}")
    return r


def read(path):
    with open(path, "rb") as f:
        return f.read()
