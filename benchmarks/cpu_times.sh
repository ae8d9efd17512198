#!/usr/bin/env bash
# Wall times of the README's two commands on this machine, idle or beside CPU hogs, as
# docs/benchmarks.md reports them ("The CPU test suite's time", "The demo's time").
#
#   benchmarks/cpu_times.sh suite RUNS HOGS   # RUNS fresh clones of HEAD, each `CI=true .ci/run`
#   benchmarks/cpu_times.sh demo RUNS HOGS    # one installed clone, RUNS `make demo` from a fresh
#                                             # demo workspace (cache folder emptied first)
#
# HOGS busy loops run beside each run and are killed after it (0: idle). One line per run goes to
# stdout and to OUT (default /tmp/kernelarc-cpu-times.txt); each run's log stays in its folder.
# The clones need ../shared (the datasets) beside them, as the checkout has: it is linked.
set -euo pipefail

what=${1:?suite or demo}
runs=${2:-3}
hogs=${3:-0}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/tmp/kernelarc-cpu-times}
out=${OUT:-/tmp/kernelarc-cpu-times.txt}
mkdir -p "$work"

start_hogs() {
    pids=()
    for _ in $(seq 1 "$hogs"); do
        timeout 3600 python3 -c "while True: pass" &
        pids+=($!)
    done
}

stop_hogs() {
    for p in "${pids[@]:-}"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null || true
    done
}
trap stop_hogs EXIT

clone() {  # a fresh clone of HEAD at $1, with the shared datasets beside it
    rm -rf "$1"
    mkdir -p "$1"
    git clone -q "$repo" "$1/repo"
    [ -e "$repo/../shared" ] && ln -s "$(cd "$repo/../shared" && pwd)" "$1/shared"
    true
}

report() {
    echo "$*" | tee -a "$out"
}

case "$what" in
suite)
    for i in $(seq 1 "$runs"); do
        dir="$work/suite$i"
        clone "$dir"
        start_hogs
        t0=$(date +%s)
        rc=0
        (cd "$dir/repo" && CI=true bash .ci/run) >"$dir/log" 2>&1 || rc=$?
        t1=$(date +%s)
        stop_hogs
        summary=$(grep -E '(passed|failed)' "$dir/log" | tail -1 || true)
        report "suite run $i hogs=$hogs rc=$rc wall=$((t1 - t0))s load=$(cut -d' ' -f1 /proc/loadavg) :: $summary"
    done
    ;;
demo)
    dir="$work/demo"
    clone "$dir"
    (cd "$dir/repo" && make install) >"$dir/install.log" 2>&1
    export KERNELARC_CACHE_DIR="$dir/cache"
    rm -rf "$KERNELARC_CACHE_DIR"
    for i in $(seq 1 "$runs"); do
        start_hogs
        rm -rf "$dir/repo/.kernelarc-demo"
        t0=$(date +%s.%N)
        rc=0
        (cd "$dir/repo" && make demo) >"$dir/demo$i.log" 2>&1 || rc=$?
        t1=$(date +%s.%N)
        stop_hogs
        # the swarm's clock at its first verdict, and at its end
        first=$(awk '/^swarm/{t=$2} /(ACCEPT|KEEP|REVERT|REJECT) /{print t; exit}' "$dir/demo$i.log")
        report "demo run $i hogs=$hogs rc=$rc wall=$(python3 -c "print(round($t1 - $t0, 1))")s first_verdict=${first:-none} load=$(cut -d' ' -f1 /proc/loadavg)"
    done
    ;;
*)
    echo "usage: $0 suite|demo [RUNS] [HOGS]" >&2
    exit 2
    ;;
esac
