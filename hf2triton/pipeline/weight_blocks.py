"""`onnx.quantize: gguf-blocks` -- put back the 4-bit weight blocks a GGUF source was stored in.

A GGUF checkpoint (e.g. SmolLM2 Q4_1) is dequantised to float32 when transformers loads it, so the ONNX
export reads 4 bytes per weight where the file held ~0.6: at batch 1 a decoder step reads every weight
once and is bound by memory bandwidth (2 cores here: ~19 GB/s, 538 MB of float32 weights per token).

The float32 values are exactly `d * q + m` per block of 32 along the input dimension (Q4_1: q in 0..15,
d and m float16), so the blocks are recovered from the values alone and checked bit for bit; a matrix whose
every block reproduces exactly is re-packed for ONNX Runtime's MatMulNBits (float32 compute, no activation
quantisation), every other weight stays float32. Nothing is approximated: the outputs differ from the
float32 graph only by summation order. Not re-packed: Q8_0 blocks (SmolLM2's tied embedding / LM head) --
ORT's 8-bit MatMulNBits with float32 compute took 116 ms where the float32 MatMul takes 5.4 ms (2 cores).

Q4_1 blocks have a float offset per block, which MatMulNBits' integer zero point cannot hold (its float
zero points are exact but ~20x slower on CPU), so `x @ W` is computed as `x @ (d * q)` + `blocksum(x) @ m`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

BLOCK = 32  # elements per GGUF block (Q4_0/Q4_1/Q8_0)
MS_DOMAIN = "com.microsoft"
PROTOBUF_LIMIT = 1_800_000_000  # bytes of weights kept inside model.onnx (protobuf refuses messages over 2 GB)


@dataclass(frozen=True)
class Blocks:
    """One weight [K, N] as MatMulNBits wants it: packed [N, K/BLOCK, BLOCK/2], scales [N*K/BLOCK], zero
    points (all 0), and the per-block offsets [K/BLOCK, N]."""

    packed: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray
    offsets: np.ndarray


def _as_float16_exact(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).astype(np.float32)


def affine_4bit(blocks: np.ndarray) -> Blocks | None:
    """Q4_1-style blocks [N, K/BLOCK, BLOCK] (`d * q + m`, the lowest and highest level used) or None."""
    low = blocks.min(axis=-1)
    scale = _as_float16_exact((blocks.max(axis=-1) - low) / np.float32(15))
    levels = np.rint((blocks - low[..., None]) / np.where(scale == 0, 1, scale)[..., None])
    if levels.min() < 0 or levels.max() > 15:
        return None
    if not np.array_equal(scale[..., None] * levels.astype(np.float32) + low[..., None], blocks):
        return None
    q = levels.astype(np.uint8)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)
    rows, count = scale.shape
    zero_points = np.zeros((rows, (count + 1) // 2), dtype=np.uint8)  # 4-bit zero points, two per byte: all 0
    return Blocks(packed, scale.reshape(-1), zero_points.reshape(-1), np.ascontiguousarray(low.T))


def recover_blocks(weight_kn: np.ndarray) -> Blocks | None:
    """The exact 4-bit block form of a MatMul weight [K, N], or None when it has none."""
    if weight_kn.ndim != 2 or weight_kn.dtype != np.float32 or weight_kn.shape[0] % BLOCK:
        return None
    k, n = weight_kn.shape
    return affine_4bit(np.ascontiguousarray(weight_kn.T).reshape(n, k // BLOCK, BLOCK))


def _weight(inits: dict[str, Any], producers: dict[str, Any], node) -> tuple[np.ndarray, list[str]] | None:
    """The constant [K, N] weight of a MatMul (an initializer, or a Transpose of one as for tied
    embeddings) and the names it is made of; None when the second input is not constant."""
    from onnx import numpy_helper

    name = node.input[1]
    if name in inits:
        return numpy_helper.to_array(inits[name]), [name]
    source = producers.get(name)
    if source is not None and source.op_type == "Transpose" and source.input[0] in inits:
        perm = [list(a.ints) for a in source.attribute if a.name == "perm"]
        if not perm or perm[0] == [1, 0]:
            return numpy_helper.to_array(inits[source.input[0]]).T, [source.input[0], name]
    return None


def _replacement(node, blocks: Blocks, k: int, n: int, indicators: dict[int, Any]) -> tuple[list, list]:
    """Nodes and initializers computing `node`'s output from `blocks`:
    MatMulNBits(x) + (x @ S) @ m, with S the shared [K, K/BLOCK] block indicator (x @ S = block sums)."""
    from onnx import helper, numpy_helper

    x, (y,), prefix = node.input[0], node.output, f"{node.name or node.output[0]}.gguf"
    if k not in indicators:
        indicator = np.kron(np.eye(k // BLOCK, dtype=np.float32), np.ones((BLOCK, 1), np.float32))
        indicators[k] = numpy_helper.from_array(indicator, f"gguf_block_indicator_{k}")
    inits = [
        numpy_helper.from_array(blocks.packed, f"{prefix}.q4"),
        numpy_helper.from_array(blocks.scales, f"{prefix}.scales"),
        numpy_helper.from_array(blocks.zero_points, f"{prefix}.zero_points"),
        numpy_helper.from_array(blocks.offsets, f"{prefix}.offsets"),
    ]
    attrs = {"domain": MS_DOMAIN, "K": k, "N": n, "bits": 4, "block_size": BLOCK}  # float32 compute (accuracy_level 0)
    nodes = [
        helper.make_node("MatMulNBits", [x, *(i.name for i in inits[:3])], [f"{prefix}/scaled"], name=f"{prefix}/MatMulNBits", **attrs),
        helper.make_node("MatMul", [x, indicators[k].name], [f"{prefix}/block_sums"], name=f"{prefix}/BlockSums"),
        helper.make_node("MatMul", [f"{prefix}/block_sums", inits[3].name], [f"{prefix}/offset"], name=f"{prefix}/Offsets"),
        helper.make_node("Add", [f"{prefix}/scaled", f"{prefix}/offset"], [y], name=f"{prefix}/Add"),
    ]
    return nodes, inits


def pack_gguf_blocks(onnx_path: Path) -> dict[str, int]:
    """Rewrite `onnx_path` in place; returns what was packed, for export.json."""
    import onnx
    from onnx import helper

    header = onnx.load(str(onnx_path), load_external_data=False)
    external = {
        entry.value
        for init in header.graph.initializer
        if init.data_location == onnx.TensorProto.EXTERNAL
        for entry in init.external_data
        if entry.key == "location"
    }
    model = onnx.load(str(onnx_path))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    indicators: dict[int, Any] = {}
    new_nodes, new_inits, replaced = [], [], set()
    report = {"packed_4bit": 0, "kept_float32": 0, "float32_bytes_replaced": 0, "packed_bytes": 0}
    for node in graph.node:
        found = _weight(inits, producers, node) if node.op_type == "MatMul" else None
        blocks = recover_blocks(found[0]) if found else None
        if blocks is None:
            report["kept_float32"] += found is not None
            new_nodes.append(node)
            continue
        nodes, packed = _replacement(node, blocks, *found[0].shape, indicators)
        new_nodes.extend(nodes)
        new_inits.extend(packed)
        replaced.update(found[1])
        report["packed_4bit"] += 1
        report["float32_bytes_replaced"] += found[0].nbytes
        report["packed_bytes"] += sum(len(i.raw_data) for i in packed)
    if not replaced:
        return report
    used = {name for node in new_nodes for name in node.input}
    # a Transpose feeding only a replaced MatMul (a tied embedding used as the LM head) goes too
    new_nodes = [node for node in new_nodes if node.op_type != "Transpose" or node.output[0] in used]
    used = {name for node in new_nodes for name in node.input} | {o.name for o in graph.output}
    kept = [i for i in graph.initializer if i.name not in replaced or i.name in used]
    del graph.node[:]
    graph.node.extend(new_nodes)
    del graph.initializer[:]
    graph.initializer.extend([*kept, *new_inits, *indicators.values()])
    if not any(op.domain == MS_DOMAIN for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    _save(model, onnx_path, external)
    return report


def _save(model, onnx_path: Path, old_external: set[str]) -> None:
    """One file below protobuf's 2 GB limit, else the weights in one `<name>_data` file; the export's old
    external data goes first (onnx appends to an existing data file)."""
    import onnx

    for name in old_external:
        (onnx_path.parent / name).unlink(missing_ok=True)
    weights = sum(len(i.raw_data) for i in model.graph.initializer)
    if weights < PROTOBUF_LIMIT and not old_external:
        onnx.save(model, str(onnx_path))
        return
    location = f"{onnx_path.name}_data"
    onnx.save(model, str(onnx_path), save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=1024)
