#!/usr/bin/env bash
# Prepare the H200 measurement machine (no network, no registry) from carried files in .gpu-assets/:
#   wheels/  numpy 1.26.4, protobuf, python-rapidjson, tritonclient, perf_analyzer (cp312)
#   tritonserver-trimmed.tar.xz  the nvidia-pytriton 0.7.0 wheel's tritonserver, python backend, 3.12 stub and
#                                libs (its Python client code and the 3.13 libpython left out to fit 64 MiB)
# Recipe from shared/reference/environment.md: a venv with numpy<2 first (the wheel's Python-backend stub
# breaks on string tensors under numpy 2), falling back to the machine's torch/transformers site-packages.
# scipy (and scikit-learn) there need numpy 2, so they are hidden: transformers then treats them as absent.
set -euo pipefail
ASSETS=${1:-.gpu-assets}
VENV=${VENV:-/tmp/v}
BASE_SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
python3 -m venv "$VENV"
SITE=$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
"$VENV/bin/python" -m pip install -q --no-index --no-deps "$ASSETS"/wheels/*.whl
echo "$BASE_SITE" > "$SITE/base-site.pth"
echo "import sys; [sys.modules.setdefault(m, None) for m in ('sklearn', 'scipy')]" > "$SITE/zz-hide-scipy.pth"
tar -xJf "$ASSETS/tritonserver-trimmed.tar.xz" -C "$SITE"
echo '"""nvidia-pytriton 0.7.0 tritonserver files only (trimmed for the measurement machine)."""' > "$SITE/pytriton/__init__.py"
"$VENV/bin/python" -c 'import numpy, torch, transformers, tritonclient.grpc; print("venv ready: numpy", numpy.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
