#!/usr/bin/env bash
# scripts/setup.sh: installs what weft needs to build, test and benchmark on Debian 12.
# Idempotent and quick: it asks dpkg first and touches apt only when a package is missing
# (then one 'apt-get update' and one 'apt-get install'). Needs root for that; without root it
# prints the command to run and fails.
# Usage: scripts/setup.sh [--tests]   (WF_SETUP_SKIP=1 skips it, for machines set up by hand)
#   --tests: also what only the test suite and CI's checks need (PyTorch for the parity tests,
#            Doxygen for the API reference); scripts/test.sh and .ci/run pass it, the demo not.
set -euo pipefail

tests=0
for a in "$@"; do
    case "$a" in
    --tests) tests=1 ;;
    *)
        echo "setup: unknown argument '$a' (usage: scripts/setup.sh [--tests])" >&2
        exit 2
        ;;
    esac
done

if [[ "${WF_SETUP_SKIP:-0}" == 1 ]]; then
    echo "setup: skipped (WF_SETUP_SKIP=1)"
    exit 0
fi

# What each package is for, so that a removal is a decision, not an accident.
packages=(
    build-essential   # gcc, g++ (the C++ header check), make, libc headers
    cmake             # >= 3.20
    ninja-build       # the generator the scripts use
    pkg-config        # finds hwloc; the install check uses it as a consumer would
    git               # check-format.sh lists the tracked files
    clang-format      # check-format.sh (the repo's .clang-format)
    libhwloc-dev      # sched/: topology and pinning
    hwloc             # lstopo, to see what the scheduler sees
    libuv1-dev        # transport/: bootstrap (later)
    libopenblas-dev   # ops/: CPU GEMM (later); perf/ peers
    libopenblas-pthread-dev # ops/: its static archive is weft's private BLAS, one thread
                            # per call (ops/blas.c); perf/: the threaded OpenBLAS peer
    libucx-dev        # transport/: UCX endpoints (later)
    openmpi-bin       # perf/allreduce_bench: the Open MPI all-reduce peer (mpirun, libmpi.so.40)
    libcriterion-dev  # tests/
    zlib1g-dev        # examples/weft-train: reads gzip-compressed datasets
    systemtap-sdt-dev # sys/sdt.h: USDT probes
    libtbb-dev        # perf/: the oneTBB peer
    libomp-dev        # perf/: the OpenMP peer
    python3           # perf/ and scripts that post-process JSON
    util-linux        # setarch (ThreadSanitizer with ASLR off, where the kernel needs it)
    libudev-dev       # 'pkg-config --static weft': libhwloc's static link needs -ludev
)
# --tests: the test suite's and CI's extra needs. Not the demo's: PyTorch is large.
if ((tests)); then
    packages+=(
        python3-torch # the PyTorch parity tests (perf/torch_train_compare.py,
                      # examples/train_gpt/torch_compare.py), run with /usr/bin/python3
        doxygen       # scripts/api-docs.sh: the API reference from include/weft/*.h
        clang         # .ci/run's clang stage: weft builds and passes its tests with clang;
                      # scripts/fuzz.sh: the libFuzzer targets (clang-14 on Debian 12)
        libclang-rt-14-dev # scripts/fuzz.sh: libFuzzer and the sanitizer runtimes of clang-14
    )
fi

missing=()
for p in "${packages[@]}"; do
    # PyTorch installed another way (pip) into /usr/bin/python3 serves the tests as well.
    if [[ "$p" == python3-torch ]] && /usr/bin/python3 -c 'import torch' 2>/dev/null; then
        continue
    fi
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
        missing+=("$p")
    fi
done

if ((${#missing[@]} == 0)); then
    echo "setup: all ${#packages[@]} packages present"
    exit 0
fi

echo "setup: missing: ${missing[*]}"
if [[ "$(id -u)" != 0 ]]; then
    echo "setup: not root; run this, then try again:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
echo "setup: installed ${missing[*]}"
