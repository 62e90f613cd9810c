"""The image tasks' validation probes: synthetic images made here (no download: a gradient with shapes, fixed, in PNG and
JPEG, one with an alpha channel), and what validation's requests send with them. Their reference is transformers' own
pipeline in-process (pipeline_answers.pipeline_image_answers)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from hf2triton.serving import interface

ZERO_SHOT_LABELS = ("a red square", "a blue circle", "a green gradient", "a photo of a cat")  # validation's candidate labels


def synthetic_image(width: int, height: int, seed: int, mode: str = "RGB") -> Any:
    """A fixed picture: a two-axis colour gradient, a rectangle and an ellipse placed by `seed` (PIL image)."""
    from PIL import Image, ImageDraw

    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y + 40 * seed) % 256], axis=-1)
    image = Image.fromarray(pixels.astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    draw.rectangle([width // 5, height // 4, width // 2, height // 2 + seed], fill=(220, 30 + 50 * seed, 40))
    draw.ellipse([width // 2, height // 2, width - 3, height - 3], fill=(30, 60, 200 - 40 * seed))
    return image.convert(mode)


def encoded(image: Any, image_format: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **({"quality": 90} if image_format == "JPEG" else {}))
    return buffer.getvalue()


def probe_images() -> list[bytes]:
    """Validation's three images: a PNG, a JPEG, a PNG with an alpha channel (each a size of its own)."""
    return [
        encoded(synthetic_image(48, 40, 0), "PNG"),
        encoded(synthetic_image(64, 64, 1), "JPEG"),
        encoded(synthetic_image(30, 50, 2, "RGBA"), "PNG"),
    ]


def validation_options(task: str) -> dict[str, Any] | None:
    """What validation's image requests send with the images: zero-shot's candidate labels."""
    return {interface.CANDIDATE_LABELS: list(ZERO_SHOT_LABELS)} if task == interface.ZERO_SHOT_IMAGE_CLASSIFICATION else None
