#!/usr/bin/env bash
# Issue 6 on the GPU: a four-agent scripted swarm on one seed problem (by default softmax, whose
# seeds are far from speed of light: on RMSNorm the seed is at 95% and the guard advises stop
# within minutes); its report folder
# (report.md, score plot, best kernel) is copied to OUT. Pass the device call's $OUT itself: it
# returns files at most two folders down (report/best/kernel.py is the deepest).
#   bash benchmarks/swarm_bench.sh OUT [MINUTES] [PROBLEM] [DEVICE]
set -uo pipefail
out=${1:?usage: swarm_bench.sh OUT [MINUTES] [PROBLEM] [DEVICE]}
minutes=${2:-8}
problem=${3:-softmax_lm_vocab_fp32}
device=${4:-cuda}
ws=$(mktemp -d)/ws
mkdir -p "$out"
# A device call ends at 10 minutes: 8 minutes of swarm leave room for the start, the report
# and the copy. Should the launch run long, SIGINT (which the launcher handles: it stops the
# agents and still writes the report) comes a minute after its budget.
timeout --signal=INT "$(( ${minutes%.*} * 60 + 60 ))" \
  python3 -m kernelarc_mcp.cli --workspace "$ws" launch --problem "$problem" --agents 4 --client scripted \
  --budget-minutes "$minutes" --max-candidates 100 --device "$device" -q --json > "$out/launch.json"
echo "launch exit status $?"
report=$(ls -td "$ws"/runs/*/report 2>/dev/null | head -1)
[ -n "$report" ] || { echo "no report was written"; exit 1; }
cp -r "$report" "$out/report"
python3 -m kernelarc_mcp.cli --workspace "$ws" status --json > "$out/status.json"
cat "$report/REPORT.md"
