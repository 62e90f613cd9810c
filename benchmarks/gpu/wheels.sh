# Sourced by prepare.sh and prepare_clients.sh (PY: the venv's python): cp312 wheels for the GPU machine.
# shellcheck shell=bash
PLATFORMS=()
for tag in manylinux_2_39 manylinux_2_38 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
  manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done

# What the machine has (KINDS.md, 2026-11) in a version that works: not carried.
ON_MACHINE=" aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer click filelock \
frozenlist fsspec grpcio h11 hf-xet idna jinja2 markupsafe ml-dtypes multidict packaging propcache psutil pyyaml \
regex requests safetensors tqdm typing-extensions urllib3 uvloop wrapt yarl tabulate accelerate matplotlib pillow "

# What the workflow imports (prepare.sh carries their closure, with the versions installed here = the pins).
# shellcheck disable=SC2034  # read by the scripts that source this file
WORKFLOW_ROOTS=(snakemake jsonschema gguf fastapi uvicorn httptools tritonclient transformers tokenizers huggingface_hub
  numpy protobuf python-rapidjson orjson
  soundfile scipy python-multipart  # speech (issue 45): decoding, resampling, the gateway's forms
  openai langchain-openai)  # the OpenAI clients the generation tests drive (`device.sh vllm-tests`)

download_wheels() {  # DIR SPEC...: each name==version not on the machine as a cp312 wheel into DIR (pure-Python
  # packages published only as sdists are built into wheels here)
  local dir=$1 spec name
  shift
  for spec in "$@"; do
    [ -n "$spec" ] || continue
    name=${spec%%==*}
    case "$ON_MACHINE" in *" $name "*) continue ;; esac
    if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
      -d "$dir" "$spec" 2>/dev/null; then
      echo "prepare: $spec has no cp312 wheel: building one from its sdist (pure Python)"
      "$PY" -m pip wheel -q --no-deps -w "$dir" "$spec"
    fi
  done
}
