#!/usr/bin/env python3
"""examples/weft-train/ps_async_check.py: asynchronous parameter servers in weft-train train:
runs 'weft-run -n K+W weft-train ARGS --strategy ps --ps-ranks K --staleness S' and fails
unless it exits 0 and the worker's final line reports a test accuracy of at least MIN percent
(the worker evaluates its own rows of the test set: an estimate of the global figure).
Standard library only.
Usage: ps_async_check.py WEFT_RUN WEFT_TRAIN K W S MIN [ARGS...]"""
import re
import subprocess
import sys


def main():
    weft_run, exe = sys.argv[1], sys.argv[2]
    k, w, s, least = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    cmd = [weft_run, "-n", str(k + w), exe, *sys.argv[7:], "--strategy", "ps", "--ps-ranks",
           str(k), "--staleness", str(s)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    sys.stdout.write(p.stdout + p.stderr)
    if p.returncode != 0:
        sys.exit(f"ps_async_check: {' '.join(cmd)} exited with {p.returncode}")
    m = re.findall(r"test accuracy ([0-9.]+)%", p.stdout + p.stderr)
    if not m:
        sys.exit("ps_async_check: no 'test accuracy' line")
    acc = float(m[-1])
    if acc < least:
        sys.exit(f"ps_async_check: staleness {s}: test accuracy {acc}% below {least}%")
    print(f"ps_async_check: {k} server(s) + {w} workers, staleness {s}: test accuracy {acc}% "
          f"(at least {least}%)")


if __name__ == "__main__":
    main()
