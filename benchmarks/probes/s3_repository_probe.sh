#!/usr/bin/env bash
# Does the nvidia-pytriton wheel's tritonserver load an s3:// model repository itself (issue 26 #2)? A one-model
# repository (a Python echo model) is uploaded to moto's S3 server on the loopback and served straight from
# s3://http://127.0.0.1:PORT/bucket/prefix (Triton's syntax for an S3-compatible endpoint); one request checks it.
# Run after `make serve` (its .hf2triton/server/backends holds the Python backend stub hf2triton installs) and with
# the test tools (`make .venv/.installed-test`: moto):
#     bash benchmarks/probes/s3_repository_probe.sh [BACKENDS_DIR]
# 2026-12-03, this 2-core machine: HTTP 200 and the echoed value; the model was loaded from a local copy Triton made
# (/tmp/folderXXXX), so a published model's relative paths resolve there too.
set -euo pipefail
VENV=${VENV:-.venv}
BACKENDS=$(realpath "${1:-.hf2triton/server/backends}")
TRITON="$VENV/lib/python3.11/site-packages/pytriton/tritonserver"
WORK=$(mktemp -d)
mkdir -p "$WORK/repo/echo/1"
cat > "$WORK/repo/echo/config.pbtxt" <<'PBTXT'
name: "echo"
backend: "python"
max_batch_size: 0
input [{ name: "x", data_type: TYPE_FP32, dims: [1] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [1] }]
PBTXT
cat > "$WORK/repo/echo/1/model.py" <<'PY'
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        print("loaded from", args["model_repository"], flush=True)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]) for r in requests]
PY
read -r S3 HTTP GRPC METRICS < <("$VENV/bin/python" -c "from hf2triton import host; print(*host.free_ports(4))")
"$VENV/bin/moto_server" -H 127.0.0.1 -p "$S3" > "$WORK/moto.log" 2>&1 &
MOTO=$!
trap 'kill $MOTO ${SERVER:-} 2>/dev/null || true; rm -rf "$WORK"' EXIT
sleep 3
export AWS_ACCESS_KEY_ID=probe AWS_SECRET_ACCESS_KEY=probe AWS_DEFAULT_REGION=us-east-1
"$VENV/bin/python" - "$S3" "$WORK/repo" <<'PY'
import pathlib, sys
import boto3
client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}")
client.create_bucket(Bucket="probe")
root = pathlib.Path(sys.argv[2])
for path in root.rglob("*"):
    if path.is_file():
        client.upload_file(str(path), "probe", f"published/model_repository/{path.relative_to(root)}")
PY
PATH="$VENV/bin:$PATH" LD_LIBRARY_PATH="$VENV/lib/python3.11/site-packages/nvidia_pytriton.libs:$TRITON/external_libs" \
  "$TRITON/bin/tritonserver" --model-repository="s3://http://127.0.0.1:$S3/probe/published/model_repository" \
  --backend-directory="$BACKENDS" --http-address=127.0.0.1 --http-port="$HTTP" --grpc-address=127.0.0.1 --grpc-port="$GRPC" \
  --metrics-address=127.0.0.1 --metrics-port="$METRICS" --allow-gpu-metrics=false > "$WORK/triton.log" 2>&1 &
SERVER=$!
for _ in $(seq 60); do curl -sf "127.0.0.1:$HTTP/v2/health/ready" > /dev/null && break; sleep 1; done
curl -s -X POST "127.0.0.1:$HTTP/v2/models/echo/infer" -d '{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[4.5]}]}'
echo
grep -h "loaded from\|successfully loaded\|failed to load" "$WORK/triton.log"
