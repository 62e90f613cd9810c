#!/usr/bin/env bash
# Does adopting the tuning overlay improve measured throughput? bench -> tune -> bench with the overlay,
# in a scratch directory with its own ports (the served default models are not touched).
#   bash benchmarks/bench-2cpu/tune_demo.sh            (2-core CPU: ~15 min)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-$ROOT/benchmarks/.work/tune-demo}
OUT=$ROOT/benchmarks/bench-2cpu/tune-demo
SMK=("$ROOT/.venv/bin/snakemake" -s "$ROOT/Snakefile" -d "$WORK" --cores 1)
export HF2TRITON_CONFIG=$ROOT/benchmarks/bench-2cpu/config-untuned.yaml
mkdir -p "$WORK" "$OUT"
"${SMK[@]}" bench
cp "$WORK/results/bench/minilm.json" "$OUT/before.json"
"${SMK[@]}" tune
cp "$WORK/results/tune/overlay.yaml" "$WORK/results/tune/report.md" "$WORK/results/tune/results.json" "$OUT/"
"${SMK[@]}" bench --configfile "$WORK/results/tune/overlay.yaml"
cp "$WORK/results/bench/minilm.json" "$OUT/after.json"
"${SMK[@]}" stop
"$ROOT/.venv/bin/python" - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
before, after = (json.load(open(f"{out}/{n}.json")) for n in ("before", "after"))
def cells(d):
    return {(c["protocol"], c["request_texts"], c["concurrency"]): c["items_per_s"] for c in d["served"]}
b, a = cells(before), cells(after)
lines = ["| protocol | texts/request | concurrency | before texts/s | after texts/s | after / before |", "|---|---|---|---|---|---|"]
for key in sorted(b):
    if key in a:
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {b[key]:.1f} | {a[key]:.1f} | {a[key] / b[key]:.2f} |")
settings = lambda d: f"backend {d['backend']}, max_batch_size {d['max_batch_size']}, {d['instances']} instance(s), delay {d['max_queue_delay_us']} us"
text = "\n".join([f"before: {settings(before)}", f"after:  {settings(after)}", "", *lines, ""])
open(f"{out}/comparison.md", "w").write(text)
print(text)
PY
