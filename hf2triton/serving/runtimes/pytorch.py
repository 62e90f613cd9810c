"""backend python: the transformers model itself, run by torch on the instance's device."""

from __future__ import annotations

from typing import Any


def torch_dtype(name: str, device: str):
    """dtype auto: float16 on a GPU, float32 on the CPU."""
    import torch

    if name == "auto":
        return torch.float16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def load(spec: Any):
    """The saved model as its task's transformers class (`spec.auto_class`), in `spec.dtype`, in eval mode."""
    import transformers

    model = getattr(transformers, spec.auto_class).from_pretrained(spec.model_dir)
    return model.to(device=spec.device, dtype=torch_dtype(spec.dtype, spec.device)).eval()
