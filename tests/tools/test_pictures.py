#!/usr/bin/env python3
"""tests/tools/test_pictures.py: weft-train --plot and weft-trace on real runs (ctest runs
each mode as its own test; see tests/CMakeLists.txt).

  plot       weft-train --plot: the SVG parses as XML, its train lines hold one point per step
             of the --log file and its test dots one per evaluation, and both panels have
             tick labels
  summary    weft-trace --json on weft-train's --trace: the op kinds' times add up to the
             busy time computed here from the trace (the union of each worker's task and
             actor spans) within 1%, and the critical path is a chain of "crit" links in one
             run of the trace, ending at the node with the longest such chain of work (summed
             here from the trace), its durations adding up to that work
  truncated  a trace cut short (inside a string, between events, before the last bracket),
             or with a bad byte, is refused: exit status 1 and a message with the offset; a
             hand-written one (a bare array, escapes, surrogate pairs) is read
  svg        weft-trace --svg: the SVG parses as XML and has one lane per worker of the trace

usage: test_pictures.py MODE WEFT_TRAIN WEFT_TRACE"""
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return r


def check(cond, msg):
    if not cond:
        print("FAIL:", msg)
        sys.exit(1)


def train(weft_train, tmp, extra):
    """Runs weft-train in 'tmp'; returns the paths of its outputs."""
    out = {k: os.path.join(tmp, v) for k, v in
           (("plot", "curves.svg"), ("log", "steps.jsonl"), ("trace", "trace.json"))}
    cmd = [weft_train, "--quiet", "--plot", out["plot"], "--log", out["log"],
           "--trace", out["trace"]] + extra
    r = run(cmd, cwd=tmp)
    print(r.stdout, r.stderr)
    check(r.returncode == 0, f"{' '.join(cmd)} exited with {r.returncode}")
    check(f"plot of" in r.stdout and out["plot"] in r.stdout,
          "weft-train does not say where the plot is")
    return out


def points(elem):
    return [p for p in elem.get("points", "").split() if p]


def mode_plot(weft_train, weft_trace, tmp):
    # 100 steps of 45 a epoch: evaluations after steps 45, 90 and 100
    out = train(weft_train, tmp, ["--steps", "100"])
    lines = [json.loads(l) for l in open(out["log"])]
    steps = [l for l in lines if "eval" not in l]
    evals = [l for l in lines if "eval" in l]
    check(len(steps) == 100 and len(evals) == 3, f"{len(steps)} steps, {len(evals)} evals logged")
    root = ET.parse(out["plot"]).getroot()  # raises on anything that is not XML
    check(root.tag == SVG + "svg", f"the root element is {root.tag}")
    by_class = {}
    for e in root.iter():
        c = e.get("class")
        if c:
            by_class.setdefault(c, []).append(e)
    for cls in ("train-loss", "train-accuracy"):
        check(len(by_class.get(cls, [])) == 1, f"one polyline of class {cls}")
        n = len(points(by_class[cls][0]))
        check(n == len(steps), f"{cls} has {n} points, the log {len(steps)} steps")
    for cls in ("test-loss", "test-accuracy"):
        n = len(by_class.get(cls, []))
        check(n == len(evals), f"{n} {cls} dots, the log has {len(evals)} evaluations")
    # the step axis's points are in order, and the accuracy (a fraction in the log) is drawn
    xs = [float(p.split(",")[0]) for p in points(by_class["train-loss"][0])]
    check(xs == sorted(xs), "the train-loss points are not in step order")
    texts = [t.text or "" for t in root.iter(SVG + "text")]
    check("step" in texts and "accuracy (%)" in texts and "loss (cross-entropy)" in texts,
          "axis labels missing")
    check(sum(t.strip().replace(".", "").isdigit() for t in texts) >= 10, "too few tick labels")
    check(all("accuracy" in l for l in steps), "the log's step lines lack the accuracy")
    print(f"ok: {len(steps)} points per train line, {len(evals)} test dots")


def busy_from_trace(trace):
    """The union of each worker's task and actor spans, in us, summed over workers."""
    spans = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("task", "actor"):
            spans.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    total = 0.0
    for s in spans.values():
        s.sort()
        end = None
        for a, b in s:
            if end is None or a > end:
                total += b - a
                end = b
            elif b > end:
                total += b - end
                end = b
    return total, len(spans)


def mode_summary(weft_train, weft_trace, tmp):
    # wide layers and big batches, so that matmuls split into parallel_for chunks that nest
    out = train(weft_train, tmp, ["--steps", "30", "--threads", "2", "--hidden", "512,512",
                                  "--batch", "256"])
    r = run([weft_trace, "--json", out["trace"]])
    check(r.returncode == 0, f"weft-trace --json exited with {r.returncode}: {r.stderr}")
    s = json.loads(r.stdout)
    trace = json.load(open(out["trace"]))
    busy, workers = busy_from_trace(trace)
    ops = sum(o["total_us"] for o in s["ops"])
    print(f"busy from the trace {busy:.3f} us on {workers} workers; weft-trace's op kinds "
          f"{ops:.3f} us, its busy {s['busy_us']:.3f} us")
    check(busy > 0, "no busy time in the trace")
    check(abs(ops - busy) <= 0.01 * busy, f"op kinds add up to {ops}, busy is {busy}")
    check(abs(s["busy_us"] - busy) <= 0.01 * busy, f"busy_us {s['busy_us']} vs {busy}")
    chunks = sum(1 for e in trace["traceEvents"] if e.get("args", {}).get("chunk"))
    print(f"{chunks} parallel_for chunk events")
    # the critical path: consecutive nodes linked by "crit", all in one run, ending at the
    # node with the most work behind it (its duration plus its crit's, recursively)
    cp = s["critical_path"]
    nodes = cp["nodes"]
    check(cp["by"] == "crit" and len(nodes) >= 2, f"a critical path of {len(nodes)} nodes by {cp['by']}")
    run_ev = [e for e in trace["traceEvents"]
              if e.get("args", {}).get("graph") == cp["graph"]
              and e["args"].get("run") == cp["run"] and not e["args"].get("chunk")]
    by_node = {e["args"]["node"]: e for e in run_ev}
    work = {}

    def work_of(n):
        if n not in work:
            c = by_node[n]["args"]["crit"]
            work[n] = by_node[n]["dur"] + (work_of(c) if c >= 0 else 0)
        return work[n]
    most = max(by_node, key=work_of)
    check(nodes[-1]["node"] == most,
          f"the path ends at node {nodes[-1]['node']}, the most work is behind node {most}")
    check(by_node[nodes[0]["node"]]["args"]["crit"] == -1, "the path does not start at a root")
    for a, b in zip(nodes, nodes[1:]):
        check(by_node[b["node"]]["args"]["crit"] == a["node"],
              f"node {b['node']} follows {a['node']} on the path but its crit is "
              f"{by_node[b['node']]['args']['crit']}")
    span = sum(n["dur_us"] for n in nodes)
    check(abs(span - work_of(most)) <= 1e-6 * work_of(most) + 0.01,
          f"the path's durations add up to {span}, its work is {work_of(most)}")
    check(s["steps"]["runs"] >= 30, f"{s['steps']['runs']} runs of the step graph")
    r = run([weft_trace, out["trace"]])
    check(r.returncode == 0 and "critical path of run" in r.stdout and "time per op kind"
          in r.stdout and "stolen %" in r.stdout, "the table lacks a section")
    print(r.stdout)
    print(f"ok: op kinds {ops:.3f} us = busy {busy:.3f} us; a path of {len(nodes)} nodes, "
          f"{span:.3f} us of work")


def mode_truncated(weft_train, weft_trace, tmp):
    out = train(weft_train, tmp, ["--steps", "5"])
    data = open(out["trace"], "rb").read()
    inside_string = data.index(b'"name":"') + 10
    between = data.index(b"},\n{", len(data) // 2) + 2
    cases = {
        "inside a string": data[:inside_string],
        "between events": data[:between],
        "before the last bracket": data.rstrip()[:-1],
        "half": data[:len(data) // 2],
        "empty": b"",
        "a bad byte": data[:between] + b"\x01" + data[between:],
        "a missing comma": data[:between - 1] + data[between:],
    }
    for what, text in cases.items():
        p = os.path.join(tmp, "bad.json")
        open(p, "wb").write(text)
        r = run([weft_trace, p])
        print(f"{what}: exit {r.returncode}: {r.stderr.strip()}")
        check(r.returncode == 1, f"{what}: exit status {r.returncode}, expected 1")
        check("offset" in r.stderr and p in r.stderr, f"{what}: the message lacks the offset")
    # valid JSON of another shape (a bare array of events) with escapes in the kinds
    p = os.path.join(tmp, "hand.json")
    open(p, "w").write('[{"name":"a","cat":"task","ph":"X","tid":3,"ts":1.5,"dur":2e0,'
                       '"args":{"kind":"k\\u00e9\\ud83d\\ude00\\n\\"x\\"","graph":1,'
                       '"run":0,"node":0,"after":-1}},\n'
                       '{"name":"b","ph":"X","tid":3,"ts":2.0,"dur":0.5,"args":{}},'
                       '{"name":"c","ph":"i","s":"t","tid":4,"ts":9,"extra":[1,{"z":null}]}]')
    r = run([weft_trace, "--json", p])
    check(r.returncode == 0, f"a valid hand-written trace: exit {r.returncode}: {r.stderr}")
    s = json.loads(r.stdout)
    kinds = {o["kind"]: o for o in s["ops"]}
    check("k\u00e9\U0001F600\n\"x\"" in kinds, f"escapes decoded wrongly: {list(kinds)}")
    check(abs(s["busy_us"] - 2.0) < 1e-9, f"busy {s['busy_us']}, expected 2 (b nests in a)")
    check(abs(kinds["b"]["total_us"] - 0.5) < 1e-9, "b's self time is not 0.5")
    check(sorted(w["tid"] for w in s["workers"]) == [3, 4], "workers are not tids 3 and 4")
    print("ok")


def mode_svg(weft_train, weft_trace, tmp):
    out = train(weft_train, tmp, ["--steps", "20", "--threads", "2"])
    svg = os.path.join(tmp, "step.svg")
    r = run([weft_trace, "--svg", svg, "--step", "10", out["trace"]])
    print(r.stdout[-400:], r.stderr)
    check(r.returncode == 0, f"weft-trace --svg exited with {r.returncode}")
    trace = json.load(open(out["trace"]))
    tids = {e["tid"] for e in trace["traceEvents"] if "tid" in e}
    root = ET.parse(svg).getroot()
    lanes = [g for g in root.iter(SVG + "g") if g.get("class") == "lane"]
    lane_tids = sorted(int(g.get("data-tid")) for g in lanes)
    check(lane_tids == sorted(tids), f"lanes for tids {lane_tids}, the trace has {sorted(tids)}")
    boxes = [e for e in root.iter(SVG + "rect") if e.get("class") == "task"]
    check(len(boxes) > 0, "no task boxes")
    check(any(g.get("class") == "legend" for g in root.iter(SVG + "g")), "no legend")
    check("run 10 " in "".join(t.text or "" for t in root.iter(SVG + "text")),
          "the title does not name run 10")
    r = run([weft_trace, "--svg", svg, "--step", "100000", out["trace"]])
    check(r.returncode == 1 and "--step 100000" in r.stderr, "a missing step is not refused")
    print(f"ok: {len(lanes)} lanes, {len(boxes)} boxes")


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    mode, weft_train, weft_trace = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="weft-pictures-") as tmp:
        {"plot": mode_plot, "summary": mode_summary, "truncated": mode_truncated,
         "svg": mode_svg}[mode](weft_train, weft_trace, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
