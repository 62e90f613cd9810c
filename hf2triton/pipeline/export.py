"""Step `export_onnx`: the saved pretrained model -> ONNX (Hugging Face Optimum, or for decoders ONNX Runtime
GenAI's model builder), optionally fused by ONNX Runtime's transformer optimizer and dynamically quantised to
int8, or with a GGUF source's 4-bit weight blocks re-packed (`weight_blocks.py`); the image and speech tasks'
exports and their parity gate are media_export.py's. Only for models with backend onnx or tensorrt. The output
directory (model.onnx or the decoder files, config, tokenizer, export.json) is written atomically.

Why eager attention for encoders: with the default SDPA attention ONNX Runtime fuses nothing; exported
from eager attention its BERT optimizer fuses attention, SkipLayerNorm and GELU (measured: 1.24x torch,
int8 per-channel on the fused graph 1.77x at cosine >= 0.987; see shared performance facts).

Why the GenAI builder for decoders: optimum's decoder graph spells attention, rotary embedding and RMSNorm out
in ~3,000 small nodes per step (SmolLM2: Unsqueeze 526, Gather 458, Concat 304, ... ~45% of a decoded token's
kernel time); the builder emits ~340 (GroupQueryAttention with rotary inside, SkipSimplifiedLayerNorm):
SmolLM2 float32 32 vs 42 ms per token, with gguf-blocks 22-25 vs 32-39 ms (2 cores; benchmarks/bench-2cpu).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_directory, human_bytes, tree_size
from hf2triton.integrity import write_manifest
from hf2triton.pipeline.media_export import MEDIA_OPTIMUM_TASKS, export_media
from hf2triton.serving.interface import CLASSIFICATION, FEATURE_EXTRACTION, FILL_MASK, GENERATION, TEXT_RANKING, TOKEN_CLASSIFICATION

log = logging.getLogger(__name__)

# Bumped whenever the export logic changes what it produces: it is a param of the rule, so an upgrade of
# hf2triton re-exports (Snakemake does not rerun jobs for changes in imported modules).
EXPORT_VERSION = 5

OPTIMUM_TASKS = {FEATURE_EXTRACTION: "feature-extraction", CLASSIFICATION: "text-classification", GENERATION: "text-generation-with-past"}
# the encoder tasks whose export is the model's logits (a reranker is a one-label sequence classifier)
OPTIMUM_TASKS |= {TOKEN_CLASSIFICATION: "token-classification", FILL_MASK: "fill-mask", TEXT_RANKING: "text-classification"}
ENCODER_MODEL_TYPES = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "distilbert": "bert", "mpnet": "bert", "electra": "bert"}
# the image and speech tasks (media_export.py: the model's own task for optimum, then the parity gate)
OPTIMUM_TASKS |= MEDIA_OPTIMUM_TASKS
OPTIMIZATION_LEVELS = {"none": 0, "O1": 1, "O2": 2, "O3": 2}  # O3 = O2 + GELU approximation below


def _fuse_encoder(onnx_path: Path, config: dict[str, Any], level: str, for_gpu: bool = False) -> dict[str, int]:
    """ONNX Runtime's transformer optimizer on a BERT-like encoder; returns the fused operator counts. For the GPU
    only its own fusions run (opt_level 0): ONNX Runtime's graph optimizations are then applied when the CUDA
    provider loads the model, for that provider (offline they would be the CPU provider's here)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    model_type = ENCODER_MODEL_TYPES[config["model_type"]]
    options = FusionOptions(model_type)
    options.enable_gelu_approximation = level == "O3"
    optimized = optimize_model(
        str(onnx_path),
        model_type=model_type,
        num_heads=config.get("num_attention_heads", 0),
        hidden_size=config.get("hidden_size", 0),
        optimization_options=options,
        opt_level=0 if for_gpu else OPTIMIZATION_LEVELS[level],
        use_gpu=for_gpu,
    )
    optimized.save_model_to_file(str(onnx_path))
    return {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}


def _to_float16(onnx_path: Path) -> int:
    """Weights and compute in float16 for the CUDA provider; inputs and outputs keep their types (int64 ids in,
    float32 out), so the served model's tensors do not change. Returns the number of float16 initializers."""
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(onnx_path)))
    model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(onnx_path))
    return sum(1 for tensor in model.model.graph.initializer if tensor.data_type == onnx.TensorProto.FLOAT16)


def _quantize(onnx_path: Path) -> list[str]:
    """Dynamic int8, per channel (per-tensor loses too much: cosine 0.94 on MiniLM), MatMul and fused
    Attention only, first encoder layer kept in fp32. Measured on MiniLM, 40 parity probes, 2 cores:
    everything quantised 0.976 min cosine / 228 sentences/s; without the embedding Gather 0.976 / 223;
    and with layer 0's MatMuls in fp32 0.989 / 195 (torch: 111). Returns the nodes kept in fp32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    keep_fp32 = [node.name for node in graph.node if node.op_type == "MatMul" and "layer.0/" in node.name]
    quantized = onnx_path.with_name("model.int8.onnx")
    quantize_dynamic(
        str(onnx_path),
        str(quantized),
        weight_type=QuantType.QInt8,
        per_channel=True,
        op_types_to_quantize=["MatMul", "Attention"],
        nodes_to_exclude=keep_fp32,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    quantized.replace(onnx_path)
    return keep_fp32


def _pack_gguf_blocks(onnx_path: Path) -> dict[str, int]:
    from hf2triton.pipeline.weight_blocks import pack_gguf_blocks

    log.info("re-packing the GGUF's 4-bit weight blocks (lossless, checked bit for bit)")
    report = pack_gguf_blocks(onnx_path)
    log.info(
        "%d MatMul weights back in 4-bit blocks (%s of float32 -> %s), %d kept in float32",
        report["packed_4bit"],
        human_bytes(report["float32_bytes_replaced"]),
        human_bytes(report["packed_bytes"]),
        report["kept_float32"],
    )
    if not report["packed_4bit"]:
        log.warning(
            "onnx.quantize gguf-blocks: no weight of this model is in Q4_1-style 4-bit blocks (other GGUF types such as "
            "Q4_K or Q8_0 are not re-packed); it is served in float32, as with quantize: none"
        )
    return report


def _build_with_genai(pretrained: str, out: Path, architectures: list[str], required: bool, precision: str) -> bool:
    """ONNX Runtime GenAI's model builder into `out` (float32 for the CPU provider, float16 for the CUDA one), in a
    child process (it loads its own heavy imports and prints per-tensor progress). False when it does not know the
    architecture and the config did not ask for it by name (the caller then uses optimum)."""
    log.info("building the decoder graph with ONNX Runtime GenAI's model builder (fused attention); ~10-30 s")
    cache = out / ".builder-cache"
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", pretrained, "-o", str(out)]
    command += ["-p", "fp16", "-e", "cuda"] if precision == "float16" else ["-p", "fp32", "-e", "cpu"]
    command += ["-c", str(cache)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603 - fixed program, no shell
    shutil.rmtree(cache, ignore_errors=True)
    if done.returncode == 0:
        for name in ("config.json", "generation_config.json"):  # the builder writes its own genai_config.json only
            if (Path(pretrained) / name).is_file():
                shutil.copy2(Path(pretrained) / name, out / name)
        return True
    lines = [line.strip() for line in (done.stdout + done.stderr).replace("\r", "\n").splitlines() if line.strip()]
    if any("is not currently supported" in line for line in lines[-5:]):
        unknown = f"ONNX Runtime GenAI's model builder does not know the architecture {', '.join(architectures) or '?'}"
        if required:
            raise UserError(f"onnx.exporter = 'genai-builder': {unknown}", "use exporter: auto (optimum for such models) or optimum")
        log.warning("%s; exporting with optimum", unknown)
        for child in out.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        return False
    raise RuntimeError(f"ONNX Runtime GenAI's model builder failed (exit {done.returncode}): " + " | ".join(lines[-6:]))


def export_onnx_step(
    pretrained: str, task: str, opset: int, exporter: str, optimize: str, quantize: str, output: str, precision: str = "float32"
) -> dict[str, Any]:
    """Export `pretrained` for `task` into `output` (directory), then fuse/quantise as configured; `precision`
    float16 (ONNX Runtime on a GPU: hf2triton.specs.onnx_precision) converts a fused encoder's graph to float16 and
    has the builder make a decoder's float16 CUDA graph (optimum's decoder export stays float32: the manifest says)."""
    from optimum.exporters.onnx import onnx_export_from_model
    from transformers import AutoTokenizer

    from hf2triton.pipeline.pretrained import auto_model_class

    config = json.loads((Path(pretrained) / "config.json").read_text())
    encoder = task != GENERATION
    if quantize == "dynamic-int8" and not encoder:
        raise UserError("onnx.quantize: dynamic-int8 is supported for encoder tasks only", "use quantize: none for text-generation")
    if precision == "float16" and quantize != "none":  # hf2triton.specs.onnx_precision never asks this
        raise ValueError(f"float16 is for unquantised exports (task {task}, quantize {quantize})")
    if exporter == "genai-builder" and encoder:
        raise UserError(f"onnx.exporter: genai-builder builds decoder graphs (task is {task})", "use exporter: auto or optimum")
    started = time.monotonic()
    if task in MEDIA_OPTIMUM_TASKS:
        return _export_media_step(pretrained, task, opset, quantize, output, started)
    tokenizer = AutoTokenizer.from_pretrained(pretrained)
    with atomic_directory(output) as tmp:
        built_by = "optimum"
        required = exporter == "genai-builder"
        architectures = config.get("architectures") or []
        if not encoder and exporter != "optimum" and _build_with_genai(pretrained, tmp, architectures, required, precision):
            built_by = "genai-builder"
        else:
            if not encoder and precision == "float16":
                log.warning("optimum exports this decoder in float32: ONNX Runtime runs it on the GPU in float32")
                precision = "float32"
            log.info("exporting %s to ONNX (task %s, opset %d); this takes ~10-60 s", pretrained, OPTIMUM_TASKS[task], opset)
            # eager attention for encoders: the graph ONNX Runtime's optimizer can fuse (SDPA exports are opaque to it)
            model = auto_model_class(task).from_pretrained(pretrained, attn_implementation="eager" if encoder else None).eval()
            onnx_export_from_model(model, output=tmp, task=OPTIMUM_TASKS[task], opset=opset, do_validation=False, preprocessors=[tokenizer])
        tokenizer.save_pretrained(tmp)
        fused: dict[str, int] = {}
        if encoder and optimize != "none" and config.get("model_type") in ENCODER_MODEL_TYPES:
            log.info("fusing the encoder graph (%s)", optimize)
            fused = _fuse_encoder(tmp / "model.onnx", config, optimize, for_gpu=precision == "float16")
        half = 0
        if precision == "float16" and encoder:
            log.info("converting the graph to float16 (for ONNX Runtime's CUDA provider)")
            half = _to_float16(tmp / "model.onnx")
        if quantize == "dynamic-int8":
            log.info("quantising to int8 (dynamic, per channel)")
            _quantize(tmp / "model.onnx")
        blocks: dict[str, int] = {}
        if quantize == "gguf-blocks":
            blocks = _pack_gguf_blocks(tmp / "model.onnx")
        manifest = {
            "task": task,
            "exporter": built_by,
            "opset": opset if built_by == "optimum" else None,
            "optimize": optimize,
            "quantize": quantize,
            "precision": precision,
            **({"float16_initializers": half} if half else {}),
            "fused_operators": fused,
            **({"gguf_blocks": blocks} if blocks else {}),
            "source": str(pretrained),
        }
        (tmp / "export.json").write_text(json.dumps(manifest, indent=2) + "\n")
        write_manifest(tmp)
        manifest["bytes"] = tree_size(tmp)
    log.info(
        "exported %s in %.1f s (%s)%s",
        output,
        time.monotonic() - started,
        human_bytes(manifest["bytes"]),
        f"; fused {fused}" if fused else "",
    )
    return manifest


def _export_media_step(pretrained: str, task: str, opset: int, quantize: str, output: str, started: float) -> dict[str, Any]:
    """An image or speech task's export: optimum's, float32 and unfused, accepted only past its parity gate."""
    if quantize != "none":  # config.py refuses it first
        raise UserError(f"onnx.quantize = {quantize!r}: not for {task}", "use quantize: none")
    with atomic_directory(output) as tmp:
        media = export_media(pretrained, task, opset, tmp)
        manifest = {"task": task, "exporter": "optimum", "opset": opset, "optimize": "none", "quantize": "none", "precision": "float32"}
        manifest |= {**media, "fused_operators": {}, "source": str(pretrained)}
        (tmp / "export.json").write_text(json.dumps(manifest, indent=2) + "\n")
        write_manifest(tmp)
        manifest["bytes"] = tree_size(tmp)
    log.info("exported %s in %.1f s (%s); parity %s", output, time.monotonic() - started, human_bytes(manifest["bytes"]), media["parity"])
    return manifest
