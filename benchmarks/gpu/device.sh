#!/usr/bin/env bash
# The GPU machine's side of the H200 workflow (see benchmarks/h200/README.md for the `device` calls in order).
# Runs from the repository copy on that machine; what it keeps between calls lives in /tmp (kept while the
# machine stays warm) and in the repository copy's ignored outputs (.hf2triton/, results/).
#
#   bash benchmarks/gpu/device.sh stash .gpu-assets/callN     keep this call's pieces in /tmp/gpu-assets
#   bash benchmarks/gpu/device.sh setup                       join + verify the pieces, build the venv /tmp/v
#   bash benchmarks/gpu/device.sh serve [SNAKEMAKE ARGS]      snakemake --cores 1 serve (config.yaml + e.g. --configfile)
#   bash benchmarks/gpu/device.sh bench [SNAKEMAKE ARGS]      snakemake --cores 1 bench, results to $OUT/bench.tar.gz
#   bash benchmarks/gpu/device.sh extras                      CUDA graphs vs eager in-process, the GPU tests, and an
#                                                             over-budget config refused by preflight (server untouched)
#   bash benchmarks/gpu/device.sh probe [VARIANT ...]         single-text load on gpu-overlay.yaml ("base") and each variant
#                                                             (default: all of benchmarks/h200/single-text/), served in turn
#   bash benchmarks/gpu/device.sh bench-best                  bench on the overlay + the variant probe measured best at x16
#
# `make serve` cannot run there (no package registry): `setup` replaces its install step (the same pinned
# versions, from carried wheels) and the venv recipe of shared/reference/environment.md (numpy 1.26.4 first,
# the machine's torch found through a .pth file); `serve` and `bench` are the Makefile's own snakemake commands.
set -euo pipefail
STORE=/tmp/gpu-assets
VENV=/tmp/v
step=${1:?stash|setup|serve|bench|bench-best|extras|probe}

case "$step" in
stash)
  mkdir -p "$STORE/pieces"
  cp "$2"/* "$STORE/pieces/"
  echo "stashed $(ls "$2" | wc -l) pieces; $(ls "$STORE/pieces" | wc -l) in store"
  ;;
setup)
  python3 - "$STORE" <<'PY'
import hashlib, json, sys
from pathlib import Path
store = Path(sys.argv[1])
manifest = json.loads((store / "pieces" / "MANIFEST.json").read_text())
for relative, entry in manifest.items():
    target = store / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as out:
        for piece in entry["pieces"]:
            out.write((store / "pieces" / piece).read_bytes())
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if digest != entry["sha256"]:
        sys.exit(f"setup: {relative} is corrupt (sha256 {digest} != {entry['sha256']}): carry its pieces again")
print(f"setup: {len(manifest)} files joined and verified")
PY
  BASE_SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
  python3 -m venv "$VENV"
  SITE=$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile "$STORE"/wheels/*.whl "$STORE"/models/*.whl
  echo "$BASE_SITE" > "$SITE/base-site.pth"  # torch, CUDA libraries, accelerate, matplotlib: the machine's own
  # scipy, scikit-learn and jax there need numpy 2; transformers imports them only if present, so they are hidden.
  echo "import sys; [sys.modules.setdefault(m, None) for m in ('sklearn', 'scipy', 'jax', 'jaxlib', 'flax', 'optax')]" > "$SITE/zz-hide-numpy2.pth"
  tar -xJf "$STORE/server/tritonserver-trimmed.tar.xz" -C "$SITE"
  echo '"""nvidia-pytriton 0.7.0: its tritonserver files only (trimmed for the GPU machine)."""' > "$SITE/pytriton/__init__.py"
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation -e .
  "$VENV/bin/python" -c 'import numpy, torch, transformers, snakemake, tritonclient.grpc, fastapi; print("venv ready: numpy", numpy.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))'
  ;;
serve | bench)
  export PATH="$VENV/bin:$PATH"  # the Python-backend stub takes numpy from the first python3 on PATH
  set +e
  "$VENV/bin/snakemake" --cores 1 "$step" "${@:2}"
  rc=$?
  set -e
  "$VENV/bin/snakemake" --cores 1 status "${@:2}" > results/status.json 2>/dev/null || true
  if [ -n "${OUT:-}" ]; then  # at most 8 files come back: one archive per step
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > results/nvidia-smi.csv 2>/dev/null || true
    tail -n 300 .hf2triton/server/tritonserver.log > results/tritonserver-tail.log 2>/dev/null || true
    tar -czf "$OUT/$step.tar.gz" --exclude='results/bench/scratch' --exclude='results/logs' results
    tar -czf "$OUT/$step-logs.tar.gz" results/logs .hf2triton/server/*.log 2>/dev/null || true
  fi
  exit $rc
  ;;
extras)
  export PATH="$VENV/bin:$PATH"
  mkdir -p results/extras
  "$VENV/bin/python" benchmarks/gpu/graphs_ab.py .hf2triton/models/minilm/pretrained results/extras/graphs-ab.json || true
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider -k "cuda or gpu_budget" tests/test_serving_engines.py tests/test_preflight.py \
    > results/extras/pytest-gpu.txt 2>&1 || true
  set +e
  "$VENV/bin/snakemake" --cores 1 serve --configfile benchmarks/h200/over-budget.yaml > results/extras/over-budget.txt 2>&1
  echo "snakemake exit code: $?" >> results/extras/over-budget.txt
  set -e
  "$VENV/bin/snakemake" --cores 1 status --configfile benchmarks/h200/gpu-overlay.yaml > results/extras/status-after.txt 2>&1 || true
  nvidia-smi > results/extras/nvidia-smi.txt 2>&1 || true
  [ -z "${OUT:-}" ] || tar -czf "$OUT/extras.tar.gz" results/extras
  ;;
probe)
  export PATH="$VENV/bin:$PATH"
  mkdir -p results/probe
  rm -f results/probe/single-text.json results/probe/probe.log
  variants=("${@:2}")
  [ ${#variants[@]} -gt 0 ] || variants=(base benchmarks/h200/single-text/*.yaml)
  for variant in "${variants[@]}"; do
    files=(benchmarks/h200/gpu-overlay.yaml)
    [ "$variant" = base ] || files+=("$variant")
    label=$(basename "$variant" .yaml)
    if "$VENV/bin/snakemake" --cores 1 serve --configfile "${files[@]}" > "results/probe/serve-$label.log" 2>&1; then
      "$VENV/bin/python" benchmarks/gpu/single_text_probe.py --configfile "${files[@]}" --label "$label" \
        --out results/probe/single-text.json >> results/probe/probe.log 2>&1 || echo "$label: probe failed" >> results/probe/probe.log
    else
      echo "$label: serve failed (results/probe/serve-$label.log)" >> results/probe/probe.log
    fi
  done
  # The variant with the most single texts/s at x16 (both protocols' mean), for `bench-best`.
  "$VENV/bin/python" - > results/probe/best.txt <<'PY'
import json
entries = json.load(open("results/probe/single-text.json"))
def x16(entry):
    cells = [c["items_per_s"] for c in entry["cells"] if c["concurrency"] == 16]
    return sum(cells) / max(len(cells), 1)
print(" ".join(max(entries, key=x16)["configfiles"]))
PY
  echo "best at x16: $(cat results/probe/best.txt)"
  cat results/probe/probe.log
  [ -z "${OUT:-}" ] || tar -czf "$OUT/probe.tar.gz" results/probe
  ;;
bench-best)  # `bench` on the overlay + variant that `probe` found best (decided by the script: the machine idles back in 30 s)
  read -r -a files < results/probe/best.txt
  exec bash "$0" bench --configfile "${files[@]}"
  ;;
*)
  echo "unknown step $step" >&2
  exit 2
  ;;
esac
