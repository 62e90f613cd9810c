#!/usr/bin/env bash
# Issue 14: can single texts x16 reach 0.9x the in-process batch-32 engine on the best CPU backend (ONNX int8)?
# bench -> tune (batch size x instances x queue delay) -> bench with the overlay, scratch directory and ports.
#   bash benchmarks/bench-2cpu/tune_int8_single.sh      (2-core CPU: ~15 min)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-$ROOT/benchmarks/.work/tune-int8-single}
OUT=$ROOT/benchmarks/bench-2cpu/tune-int8-single
SMK=("$ROOT/.venv/bin/snakemake" -s "$ROOT/Snakefile" -d "$WORK" --cores 1)
export HF2TRITON_CONFIG=$ROOT/benchmarks/bench-2cpu/config-int8-single.yaml
mkdir -p "$WORK" "$OUT"
"${SMK[@]}" bench
cp "$WORK/results/bench/minilm.json" "$OUT/before.json"
cp "$WORK/results/bench/report.md" "$OUT/before-report.md"
"${SMK[@]}" tune
cp "$WORK/results/tune/overlay.yaml" "$WORK/results/tune/report.md" "$WORK/results/tune/results.json" "$OUT/"
"${SMK[@]}" bench --configfile "$WORK/results/tune/overlay.yaml"
cp "$WORK/results/bench/minilm.json" "$OUT/after.json"
cp "$WORK/results/bench/report.md" "$OUT/after-report.md"
"${SMK[@]}" stop
