#!/usr/bin/env bash
# perf/gpu-check.sh: the one prepared check for a machine with an NVIDIA GPU (issue 6), in
# under 8 minutes:
#  1. fails at once, saying why, without a GPU (nvidia-smi or the driver missing, or 0
#     devices);
#  2. configures a Release build with CUDA required (-DWF_CUDA=ON, architectures from
#     WF_CUDA_ARCH, default 90-real;90-virtual) in build-gpu (WF_BUILD_DIR) and builds the
#     library, the CUDA tests and the benchmarks;
#  3. runs the CUDA tests (ctest -R 'cuda|mixed'), which on a GPU run instead of skipping, then
#     the device suites (devices_*), and stops if one fails;
#  4. runs the GPU benchmarks: perf/gpu_gemm_bench (sgemm and bf16 GEMM through a weft graph
#     vs cuBLAS called directly; helper C2's) when it was built, and the MLP training step
#     784-4096-4096-10, batch 1024, Adam, f32, placed on the GPU by the session's placement
#     rule, against PyTorch on the same GPU (/usr/bin/python3, torch with CUDA);
#  5. prints a short table last: case, weft, peer, ratio, goal.
# Each benchmark has its own time limit, so that a hang still ends in the table.
# Usage: bash perf/gpu-check.sh      (WF_BUILD_DIR, WF_JOBS, WF_CUDA_ARCH, PYTHON)
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$SECONDS
build="${WF_BUILD_DIR:-build-gpu}"
jobs="${WF_JOBS:-$(nproc)}"
arch="${WF_CUDA_ARCH:-90-real;90-virtual}"
python="${PYTHON:-/usr/bin/python3}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
rows=()

say() { echo "gpu-check: $*"; }
die() {
    echo "gpu-check: FAIL: $*" >&2
    exit 1
}
row() { rows+=("$(printf '%-22s %12s %12s %8s  %s' "$@")"); }

# ---- 1. a GPU? ---------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L >"$out/gpus" 2>&1 || die "nvidia-smi -L failed: $(cat "$out/gpus")"
    grep -q '^GPU ' "$out/gpus" || die "nvidia-smi lists no GPU: $(cat "$out/gpus")"
elif [[ -e /dev/nvidia0 ]]; then
    echo "GPU (no nvidia-smi; /dev/nvidia0 exists)" >"$out/gpus"
else
    die "no GPU: no nvidia-smi and no /dev/nvidia0 (no NVIDIA driver on this machine)"
fi
say "$(head -1 "$out/gpus")"
[[ -x /usr/local/cuda/bin/nvcc ]] || command -v nvcc >/dev/null 2>&1 ||
    die "no nvcc: install the CUDA toolkit (/usr/local/cuda)"

# ---- 2. build ----------------------------------------------------------------------------
say "configure $build (CUDA architectures $arch)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWF_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DWF_BUILD_EXAMPLES=OFF >"$out/configure.log" 2>&1 ||
    { tail -30 "$out/configure.log" >&2; die "configure failed"; }
say "build (-j$jobs)"
timeout 240 cmake --build "$build" -j "$jobs" >"$out/build.log" 2>&1 ||
    { grep -E 'error|FAILED' "$out/build.log" | head -30 >&2; die "build failed (or took 4 min)"; }
say "built in $((SECONDS - t_start)) s"

# ---- 3. tests ----------------------------------------------------------------------------
say "CUDA tests"
if ! timeout 120 ctest --test-dir "$build" -R 'cuda|mixed' --output-on-failure -j 4 \
    >"$out/ctest.log" 2>&1; then
    tail -60 "$out/ctest.log" >&2
    die "CUDA tests failed"
fi
grep -E 'tests passed|Passed|Failed' "$out/ctest.log" | tail -20
# A test that skipped on a GPU machine would hide a problem: say so loudly.
for t in "$build"/tests/test_devices_cuda "$build"/tests/test_devices_internal_cuda; do
    [[ -x "$t" ]] || continue
    if "$t" --verbose 2>&1 | grep -q '\[SKIP\].*no CUDA device'; then
        die "$(basename "$t") skipped with 'no CUDA device' on a machine with a GPU"
    fi
done
timeout 60 ctest --test-dir "$build" -R '^devices_' --output-on-failure >"$out/ctest2.log" 2>&1 ||
    { tail -40 "$out/ctest2.log" >&2; die "device tests failed"; }

# ---- 4a. GEMM: weft vs cuBLAS (perf/gpu_gemm_bench.c) ------------------------------------
gemm="$build/perf/gpu_gemm_bench"
[[ -x "$gemm" ]] || gemm="$(find "$build/perf" -name gpu_gemm_bench -type f -perm -u+x | head -1)"
if [[ -n "$gemm" && -x "$gemm" ]]; then
    say "GEMM benchmark ($gemm --json)"
    if timeout 120 "$gemm" --json >"$out/gemm.json" 2>"$out/gemm.err"; then
        # One JSON line per case and impl: {"case": ..., "impl": "weft"|"cublas", "tflops": ...}
        "$python" - "$out/gemm.json" >"$out/gemm.rows" <<'PY' || true
import json, sys
res = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    res.setdefault(r["case"], {})[r["impl"]] = r.get("tflops")
for case, v in res.items():
    w, c = v.get("weft"), v.get("cublas")
    ratio = f"{w / c:.2f}x" if w and c else "-"
    print(f"{case}|{w:.1f} TF/s|{c:.1f} TF/s|{ratio}|>= 0.9x" if w and c else f"{case}|{w}|{c}|-|>= 0.9x")
PY
        while IFS='|' read -r a b c d e; do row "$a" "$b" "$c" "$d" "$e"; done <"$out/gemm.rows"
    else
        tail -5 "$out/gemm.err" >&2
        row "gemm" "failed" "-" "-" "see above"
    fi
else
    row "gemm" "not built" "-" "-" "perf/gpu_gemm_bench.c"
fi

# ---- 4b. the MLP step: weft (placed on the GPU) vs PyTorch on the GPU --------------------
cat >"$out/mlp.c" <<'C'
/* The MLP training step of perf/train/train_bench.c at GPU size: 784-4096-4096-10, ReLU,
 * softmax cross-entropy, Adam, batch 1024, f32. The session's placement rule puts the ops
 * with CUDA kernels on the GPU. Prints the median step time in ms. */
#include <weft/weft.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static wf_node *linear(wf_graph *g, wf_node *h, const char *name, int in, int out, uint64_t seed)
{
    char wn[32], bn[32];
    snprintf(wn, sizeof wn, "%s.weight", name);
    snprintf(bn, sizeof bn, "%s.bias", name);
    double b = 1 / sqrt((double)in);
    wf_node *w = wf_variable(g, wn, WF_F32, WF_SHAPE(out, in), wf_init_uniform(seed, -b, b));
    wf_node *bias = wf_variable(g, bn, WF_F32, WF_SHAPE(out), wf_init_uniform(seed + 1, -b, b));
    return wf_add(g, wf_matmul_ex(g, h, w, false, true), bias);
}

int main(void)
{
    enum { B = 1024, WARM = 5, REPS = 20 };
    wf_runtime *rt;
    if (wf_runtime_create(&rt, NULL) < 0) {
        fprintf(stderr, "%s\n", wf_last_errmsg());
        return 1;
    }
    if (wf_device_count_kind(rt, WF_DEVICE_CUDA) < 1) {
        fprintf(stderr, "weft sees no CUDA device\n");
        return 1;
    }
    wf_graph *g = wf_graph_create(rt, WF_STATIC);
    wf_node *x = wf_placeholder(g, "x", WF_F32, WF_SHAPE(B, 784));
    wf_node *y = wf_placeholder(g, "y", WF_I32, WF_SHAPE(B));
    wf_node *h = wf_relu(g, linear(g, x, "fc1", 784, 4096, 1));
    h = wf_relu(g, linear(g, h, "fc2", 4096, 4096, 3));
    h = linear(g, h, "fc3", 4096, 10, 5);
    wf_node *loss = wf_mean(g, wf_softmax_cross_entropy(g, h, y));
    wf_node *train = wf_minimize(g, wf_adam(1e-3), loss);
    wf_session *s;
    if (!train || wf_session_create(g, NULL, &s) < 0) {
        fprintf(stderr, "%s\n", wf_graph_errmsg(g));
        return 1;
    }
    float *xs = malloc(sizeof(float) * B * 784);
    int32_t ys[B];
    for (int i = 0; i < B * 784; i++)
        xs[i] = (float)(((int64_t)i * 7919) % 1000) / 1000.0f;
    for (int i = 0; i < B; i++)
        ys[i] = i % 10;
    wf_tensor *xv = wf_tensor_from(WF_F32, WF_SHAPE(B, 784), xs);
    wf_tensor *yv = wf_tensor_from(WF_I32, WF_SHAPE(B), ys);
    wf_feed f[2] = { { x, xv }, { y, yv } };
    double t[REPS];
    for (int r = 0; r < WARM + REPS; r++) {
        double t0 = now();
        wf_tensor *lv = NULL;
        if (wf_session_run(s, f, 2, &loss, 1, &lv, &train, 1) < 0) {
            fprintf(stderr, "%s\n", wf_session_errmsg(s));
            return 1;
        }
        if (r >= WARM)
            t[r - WARM] = (now() - t0) * 1e3;
        if (r == WARM + REPS - 1)
            fprintf(stderr, "weft loss %g\n", wf_tensor_get(lv, 0));
        wf_tensor_release(lv);
    }
    qsort(t, REPS, sizeof t[0], cmp);
    printf("%.3f\n", t[REPS / 2]);
    return 0;
}
C
mlp_weft="-"
say "MLP step (weft)"
if cc -O2 -I include "$out/mlp.c" -L "$build" -Wl,-rpath,"$PWD/$build" -lweft -lm \
    -o "$out/mlp" 2>"$out/mlp.cc.log"; then
    if timeout 100 "$out/mlp" >"$out/mlp.out" 2>"$out/mlp.err"; then
        mlp_weft="$(tail -1 "$out/mlp.out")"
        tail -1 "$out/mlp.err"
    else
        tail -5 "$out/mlp.err" >&2
        mlp_weft="failed"
    fi
else
    tail -10 "$out/mlp.cc.log" >&2
    mlp_weft="no build"
fi
say "MLP step (PyTorch)"
mlp_torch="$(timeout 90 "$python" - <<'PY' 2>"$out/torch.err" || echo failed
import time, statistics
try:
    import torch
    import torch.nn as nn
except ImportError:
    print("no-torch"); raise SystemExit(0)
if not torch.cuda.is_available():
    print("no-cuda-torch"); raise SystemExit(0)
torch.manual_seed(0)
dev = torch.device("cuda")
model = nn.Sequential(nn.Linear(784, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                      nn.Linear(4096, 10)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = ((torch.arange(1024 * 784, dtype=torch.int64) * 7919 % 1000).float() / 1000).reshape(1024, 784).to(dev)
y = (torch.arange(1024) % 10).to(dev)
lossf = nn.CrossEntropyLoss()
ts = []
for r in range(25):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = lossf(model(x), y)
    loss.backward()
    opt.step()
    l = loss.item()  # weft fetches the loss each step too
    torch.cuda.synchronize()
    if r >= 5:
        ts.append((time.perf_counter() - t0) * 1e3)
print(f"{statistics.median(ts):.3f}")
PY
)"
mlp_torch="$(tail -1 <<<"$mlp_torch")"
ratio="-"
if [[ "$mlp_weft" =~ ^[0-9.]+$ && "$mlp_torch" =~ ^[0-9.]+$ ]]; then
    ratio="$(awk -v a="$mlp_weft" -v b="$mlp_torch" 'BEGIN { printf "%.2fx", a / b }')"
fi
ms() { if [[ "$1" =~ ^[0-9.]+$ ]]; then echo "$1 ms"; else echo "$1"; fi; }
row "mlp_4096_adam_b1024" "$(ms "$mlp_weft")" "$(ms "$mlp_torch")" "$ratio" "<= 0.8x torch"

# ---- 5. the table ------------------------------------------------------------------------
echo
echo "gpu-check: $(head -1 "$out/gpus"), $((SECONDS - t_start)) s"
printf '%-22s %12s %12s %8s  %s\n' case weft peer ratio goal
for r in "${rows[@]}"; do echo "$r"; done
