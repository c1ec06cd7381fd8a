#!/usr/bin/env bash
# scripts/netns-test.sh: a 2-node job across two network namespaces, as two machines would
# run it. As root it creates namespaces A and B joined by one veth pair (10.231.R.1/24 in A,
# 10.231.R.2/24 in B: the job's only addresses), runs
# restart_train (data-parallel training with one all-reduce per step) under weft-run
# --nnodes 2 --node-rank 0 in A and --node-rank 1 in B (master 10.231.R.1), with UCX over
# TCP on the veth only (WEFT_TLS=tcp, WEFT_NET_DEVICES=the veth: namespaces still share
# memory, so shared-memory transports would bypass the link), and checks that the final
# weights equal those of the same 2 ranks on loopback (hashes, and the final checkpoint's
# bytes) and that the job's bytes crossed the veth. Then a 2-stage pipeline the same way
# (weft-train --strategy pipeline --stages 2 --micro-batches 4: the MLP's first layer on the
# node in A, the rest in B, each micro-batch's activations and gradients over the veth), whose
# per-step losses (rank 0's --log) must equal those of the same pipeline on loopback. It
# removes what it made (trap), also on failure, and every command has a timeout, so it cannot
# hang.
# Usage: scripts/netns-test.sh [BUILD_DIR]   (default: $WF_BUILD_DIR, else build)
# Exit: 0 passed, 1 failed, 77 skipped (not root, no 'ip', or namespaces not allowed here;
# the reason is printed): ctest's transport_netns counts 77 as skipped.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

B="${1:-${WF_BUILD_DIR:-$WF_ROOT/build}}"
WR="$B/tools/weft-run"
RT="$B/tests/restart_train"
WT="$B/examples/weft-train/weft-train"
STEPS=50

skip() { echo "netns-test: skipped: $*"; exit 77; }
die() { echo "netns-test: FAILED: $*"; exit 1; }

[[ -x "$WR" && -x "$RT" && -x "$WT" ]] || die "build $B first (weft-run, restart_train, weft-train)"
[[ "$(id -u)" == 0 ]] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"

tag=$$
R=$((tag % 250 + 1)) # the subnet 10.231.R.0/24, one per run: two runs never collide
NA="wf-nsa-$tag" NB="wf-nsb-$tag" VA="wfa$tag" VB="wfb$tag"
VA="${VA:0:15}" VB="${VB:0:15}"
T="$(mktemp -d /tmp/wf-netns.XXXXXX)"
cleanup()
{
    # The launchers are ours: a timeout ended them at the latest, but a failed check leaves
    # them running; then the namespaces, which take the veth pair along.
    for p in "${PIDS[@]:-}"; do
        if [[ -n "$p" ]]; then kill -9 "$p" 2>/dev/null || true; fi
    done
    ip netns del "$NA" 2>/dev/null || true
    ip netns del "$NB" 2>/dev/null || true
    ip link del "$VA" 2>/dev/null || true
    rm -rf "$T"
}
PIDS=()
trap cleanup EXIT

ip netns add "$NA" 2>"$T/err" || skip "cannot create a network namespace: $(cat "$T/err")"
ip netns add "$NB"
ip link add "$VA" type veth peer name "$VB" 2>"$T/err" ||
    skip "cannot create a veth pair: $(cat "$T/err")"
ip link set "$VA" netns "$NA"
ip link set "$VB" netns "$NB"
ip -n "$NA" addr add "10.231.$R.1/24" dev "$VA"
ip -n "$NB" addr add "10.231.$R.2/24" dev "$VB"
ip -n "$NA" link set "$VA" up
ip -n "$NB" link set "$VB" up
# Loopback up too: a rank's UCX endpoint to itself is a TCP connection to its own veth
# address, which Linux routes through 'lo' (with 'lo' down that connect hangs in SYN-SENT:
# seen here). Between the namespaces only the veth pair carries anything.
ip -n "$NA" link set lo up
ip -n "$NB" link set lo up
up() { [[ "$(ip netns exec "$1" cat "/sys/class/net/$2/operstate")" == up ]]; }
for _ in $(seq 50); do # the link comes up within a few hundred ms
    up "$NA" "$VA" && up "$NB" "$VB" && break
    sleep 0.1
done
if ! up "$NA" "$VA" || ! up "$NB" "$VB"; then die "the veth pair did not come up"; fi
echo "netns-test: $NA ($VA 10.231.$R.1) <-> $NB ($VB 10.231.$R.2)"

# The reference: the same 2 ranks on loopback in this namespace.
mkdir -p "$T/ref" "$T/job"
timeout 60 "$WR" -n 2 -- "$RT" --dir "$T/ref" --steps "$STEPS" >"$T/ref.log" 2>&1 ||
    die "the loopback run failed: $(cat "$T/ref.log")"

# job NAME PORT PROGRAM ARGS...: PROGRAM on 2 nodes, node 0 in A and node 1 in B, one rank
# each, over UCX tcp on the veth; their output in $T/NAME.node{0,1}.log.
job()
{
    local name="$1" port="$2"
    shift 2
    for node in 1 0; do # node 1 first: it waits for node 0's launcher
        ns="$NA" dev="$VA"
        [[ $node == 1 ]] && ns="$NB" dev="$VB"
        ip netns exec "$ns" env WEFT_TLS=tcp WEFT_NET_DEVICES="$dev" UCX_TLS=tcp \
            UCX_NET_DEVICES="$dev" timeout 90 "$WR" --nnodes 2 --node-rank "$node" \
            --master "10.231.$R.1:$port" --token "netns-$tag" -n 1 -- "$@" \
            >"$T/$name.node$node.log" 2>&1 &
        PIDS+=("$!")
    done
    codes=()
    for p in "${PIDS[@]}"; do
        c=0
        wait "$p" || c=$?
        codes+=("$c")
    done
    PIDS=()
    cat "$T/$name.node0.log" "$T/$name.node1.log"
    [[ "${codes[*]}" == "0 0" ]] || die "$name: the launchers exited ${codes[*]} (node 1, node 0)"
}

tx_before="$(ip netns exec "$NA" cat "/sys/class/net/$VA/statistics/tx_bytes")"
job dp "29$((tag % 90 + 10))0" "$RT" --dir "$T/job" --steps "$STEPS"
tx_after="$(ip netns exec "$NA" cat "/sys/class/net/$VA/statistics/tx_bytes")"

hash_of() { sed -n "s/^\[$2\] rank $2 final step $STEPS hash \([0-9a-f]*\)$/\1/p" "$1"; }
for r in 0 1; do
    want="$(hash_of "$T/ref.log" "$r")"
    got="$(hash_of "$T/dp.node$r.log" "$r")"
    [[ -n "$want" && "$got" == "$want" ]] || die "rank $r: hash '$got', want '$want'"
done
cmp -s "$T/ref/final.safetensors" "$T/job/final.safetensors" ||
    die "the final checkpoint differs from the loopback run's"
sent=$((tx_after - tx_before))
# 50 all-reduces of 17 floats, the rendezvous and heartbeats: several KB at least.
((sent > 4096)) || die "only $sent bytes left $VA: the job did not use the veth"
echo "netns-test: ok: 2 ranks across $NA and $NB over UCX tcp, $STEPS steps, final weights" \
    "equal the loopback run's (hash $(hash_of "$T/ref.log" 0)); $sent bytes sent on $VA"

# The pipeline: 2 stages, 4 micro-batches (1F1B), on loopback and then across the namespaces;
# rank 0 (node 0, the first stage) logs every step's loss, the global value.
PP=(--strategy pipeline --stages 2 --micro-batches 4 --steps 20 --hidden 64)
timeout 60 "$WR" -n 2 -- "$WT" "${PP[@]}" --log "$T/pp-ref.jsonl" >"$T/pp-ref.log" 2>&1 ||
    die "the loopback pipeline failed: $(cat "$T/pp-ref.log")"
tx_before="$(ip netns exec "$NA" cat "/sys/class/net/$VA/statistics/tx_bytes")"
job pp "29$((tag % 90 + 10))5" "$WT" "${PP[@]}" --log "$T/pp-job.jsonl"
tx_after="$(ip netns exec "$NA" cat "/sys/class/net/$VA/statistics/tx_bytes")"
losses() { grep -o '"loss": *[-0-9.eE+]*' "$1"; }
n_ref="$(losses "$T/pp-ref.jsonl" | wc -l)"
((n_ref >= 20)) || die "the loopback pipeline logged $n_ref losses"
cmp -s <(losses "$T/pp-ref.jsonl") <(losses "$T/pp-job.jsonl") ||
    die "the pipeline's losses across the namespaces differ from the loopback run's: $(diff \
        <(losses "$T/pp-ref.jsonl") <(losses "$T/pp-job.jsonl") | head -5)"
sent=$((tx_after - tx_before))
((sent > 4096)) || die "the pipeline: only $sent bytes left $VA: it did not use the veth"
echo "netns-test: ok: a 2-stage pipeline (weft-train, m = 4, 1f1b) across $NA and $NB:" \
    "$n_ref losses equal the loopback run's; $sent bytes sent on $VA"
