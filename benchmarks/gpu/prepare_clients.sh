#!/usr/bin/env bash
# The evaluation and benchmark clients issue 44 runs against the served models (lm-evaluation-harness, guidellm) for
# the GPU machine, which has no package registry: their cp312 wheels that prepare.sh's call folders do not carry,
# whole, packed into call folders of at most LIMIT_MIB; with them vLLM 0.22.1's `audio` extras the machine lacks (av,
# soxr: `vllm serve`'s /v1/audio/transcriptions, issue 45's anchor; not installed here, so pinned below). Run here after `make .venv/.installed-test`:
#
#     bash benchmarks/gpu/prepare_clients.sh    # -> .gpu-assets/clients/call1 ... (git-ignored)
#
# On the machine (after `device.sh setup`): `device.sh stash-clients .gpu-assets/clients/callN` for each folder, then
# `device.sh setup-clients`; `vllm-tests` then runs the lm-eval and guidellm tests too.
set -euo pipefail
ASSETS=${1:-.gpu-assets/clients}
PY=${PY:-.venv/bin/python}
LIMIT_MIB=${LIMIT_MIB:-50}  # + the repository copy (~7.4 MiB) under the 64 MiB a call carries
# shellcheck source=benchmarks/gpu/wheels.sh
source benchmarks/gpu/wheels.sh
rm -rf "$ASSETS"
mkdir -p "$ASSETS/.build"
mapfile -t WANTED < <("$PY" benchmarks/gpu/closure.py lm-eval guidellm --minus "${WORKFLOW_ROOTS[@]}")
VLLM_AUDIO=(av==19.0.2 soxr==1.1.0)  # vllm 0.22.1's METADATA: audio = av, scipy, soundfile, mistral_common[audio] (soxr)
download_wheels "$ASSETS/.build" "${WANTED[@]}" "${VLLM_AUDIO[@]}"
number=1 size=0
for wheel in $(ls -S "$ASSETS"/.build/*.whl); do  # largest first: the big ones each start a folder
  bytes=$(stat -c %s "$wheel")
  if [ $((size + bytes)) -gt $((LIMIT_MIB << 20)) ] && [ "$size" -gt 0 ]; then
    number=$((number + 1)) size=0
  fi
  mkdir -p "$ASSETS/call$number"
  mv "$wheel" "$ASSETS/call$number/"
  size=$((size + bytes))
done
rm -rf "$ASSETS/.build"
du -sh "$ASSETS"/call*
