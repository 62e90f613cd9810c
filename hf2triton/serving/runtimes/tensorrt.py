"""backend tensorrt: an engine built from the ONNX export (hf2triton.pipeline.tensorrt), on a CUDA GPU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def load(spec: Any):
    return TrtEncoder(spec.trt_engine, spec.onnx_dir, spec.output, spec.device)


class TrtEncoder:
    """A TensorRT engine (built by hf2triton.pipeline.tensorrt from the ONNX export) run on torch CUDA buffers,
    answering like a transformers model. Needs the `tensorrt` package and a CUDA GPU."""

    def __init__(self, engine_path: str, config_dir: str, output_name: str, device: str):
        import tensorrt as trt
        import torch
        from transformers import AutoConfig

        self.trt, self.torch, self.device, self.output_name = trt, torch, device, output_name
        with open(engine_path, "rb") as handle:
            self.engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(handle.read())
        if self.engine is None:
            raise RuntimeError(f"TensorRT could not load {engine_path} (built by another TensorRT version or GPU?)")
        self.context = self.engine.create_execution_context()
        self.config = AutoConfig.from_pretrained(config_dir)
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]

    def _torch_dtype(self, name: str):
        trt, torch = self.trt, self.torch
        return {trt.int32: torch.int32, trt.int64: torch.int64, trt.float16: torch.float16, trt.float32: torch.float32}[
            self.engine.get_tensor_dtype(name)
        ]

    def __call__(self, **batch):
        torch = self.torch
        keep = []
        for name in self.input_names:
            value = batch.get(name)
            if value is None and name == "position_ids":  # a decoder's export (embedders): each row's tokens from 0
                value = (batch["attention_mask"].cumsum(1) - 1).clamp(min=0)
            elif value is None:
                value = torch.zeros_like(batch["input_ids"])
            value = value.to(self.device, self._torch_dtype(name)).contiguous()
            keep.append(value)
            self.context.set_input_shape(name, tuple(value.shape))
            self.context.set_tensor_address(name, value.data_ptr())
        shape = tuple(self.context.get_tensor_shape(self.output_name))
        output = torch.empty(shape, dtype=self._torch_dtype(self.output_name), device=self.device)
        self.context.set_tensor_address(self.output_name, output.data_ptr())
        stream = torch.cuda.current_stream(self.device)
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed")
        stream.synchronize()
        return SimpleNamespace(**{self.output_name: output})
