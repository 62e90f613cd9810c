"""The image tasks: each row of a request is an encoded image (serving/images.py decodes and bounds it); the answer per
image is the JSON list of {label, score} transformers' pipeline returns, by its own post-processing.

- image-classification (`*ForImageClassification`: ViT, ConvNeXT, ...): the image processor's resize / normalise over all
  images of a Triton batch at once, one forward pass, then `ImageClassificationPipeline.postprocess` per image (its
  function_to_apply -- sigmoid for one label or multi-label models, else softmax -- and top_k).
- zero-shot-image-classification (CLIPModel, SiglipModel): the request's candidate labels put into its hypothesis
  template and tokenised as the pipeline does (padding to the longest; SigLIP: padding="max_length", 64 tokens, as it
  was trained), one forward pass over all images of the group against those texts, then
  `ZeroShotImageClassificationPipeline.postprocess` per image (softmax over the labels for CLIP, sigmoid per label for
  SigLIP), best first.

backend onnx: the same steps over optimum's export run by ONNX Runtime (runtimes/onnxruntime.py `OrtImageModel`); the
image processor and the pipeline's post-processing stay as they are. tensorrt: refused by the config.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import interface
from ..images import decode_images
from ..inputs import RequestError
from ..runtimes import RuntimeSpec, load_runtime
from .base import media_torch
from .token_classification import entities_json as answer_json
from .token_classification import postprocessor

SIGLIP_TEXT = {"padding": "max_length", "max_length": 64, "truncation": True}  # the pipeline's for siglip model types


class ImageEngine:
    """Saved model + image processor on one device; a task's subclass implements `run` over decoded images."""

    outputs = (interface.LABELS,)
    auto_class = ""
    pipeline_class = ""

    def __init__(
        self,
        model_dir: str,
        device: str = "cpu",
        dtype: str = "auto",
        num_threads: int = 0,
        backend: str = "python",
        onnx_dir: str = "",
        max_image_pixels: int = interface.DEFAULTS.max_image_pixels,
        **_: Any,
    ):
        import transformers

        self.torch = media_torch("the image tasks are", backend, device, num_threads)
        # backend onnx: tensors stay on the host, ONNX Runtime takes numpy (on a GPU its provider copies them up)
        self.device = device if backend == "python" else "cpu"
        self.max_image_pixels = max_image_pixels
        self.processor = transformers.AutoImageProcessor.from_pretrained(model_dir)
        self.setup(model_dir)
        spec = RuntimeSpec(
            model_dir=model_dir, onnx_dir=onnx_dir, device=device, dtype=dtype, num_threads=num_threads, auto_class=self.auto_class
        )
        self.model = load_runtime(backend, spec)
        self.dtype = next(self.model.parameters()).dtype if backend == "python" else self.torch.float32
        self.pipeline = postprocessor(getattr(self, "tokenizer", None), self.model.config, getattr(transformers, self.pipeline_class))

    def setup(self, model_dir: str) -> None:
        """Task-specific preparation before the model loads."""

    def decode(self, values: np.ndarray) -> list[Any]:
        """A request's IMAGE rows as RGB images (RequestError: that request's own error)."""
        return decode_images(values, self.max_image_pixels)

    def pixels(self, images: list[Any]):
        """All images through the image processor at once, on the model's device and dtype."""
        batch = self.processor(images=images, return_tensors="pt")
        return batch["pixel_values"].to(device=self.device, dtype=self.dtype)

    def as_images(self, images: list[Any]) -> list[Any]:
        """Decoded images as they are; encoded ones (bytes: the in-process reference's callers) decoded here."""
        if images and isinstance(images[0], (bytes, np.bytes_)):
            return self.decode(np.array(images, dtype=np.object_))
        return images

    @staticmethod
    def answers(rows: list[list[dict[str, Any]]]) -> dict[str, np.ndarray]:
        return {interface.LABELS: np.array([answer_json(row).encode("utf-8") for row in rows], dtype=np.object_)}


class ImageClassificationEngine(ImageEngine):
    """image-classification: the logits per image, then the pipeline's function_to_apply and top_k."""

    auto_class = interface.AUTO_CLASSES[interface.IMAGE_CLASSIFICATION]
    pipeline_class = "ImageClassificationPipeline"

    def run(
        self, images: list[Any], top_k: int = interface.DEFAULT_IMAGE_TOP_K, function_to_apply: str = "default", **_: Any
    ) -> dict[str, np.ndarray]:
        images = self.as_images(images)
        with self.torch.inference_mode():
            logits = self.model(pixel_values=self.pixels(images)).logits.float().cpu()
        function = None if function_to_apply == "default" else function_to_apply
        postprocess = self.pipeline.postprocess
        rows = [postprocess({"logits": logits[i : i + 1]}, function_to_apply=function, top_k=top_k) for i in range(len(images))]
        return self.answers(rows)


class ZeroShotImageEngine(ImageEngine):
    """zero-shot-image-classification: each image against the request's labels in its template (CLIP, SigLIP); and
    the embeddings those scores compare: images' or texts' features, L2-normalised."""

    outputs = (interface.LABELS, interface.EMBEDDING, interface.PROMPT_TOKENS)
    auto_class = interface.AUTO_CLASSES[interface.ZERO_SHOT_IMAGE_CLASSIFICATION]
    pipeline_class = "ZeroShotImageClassificationPipeline"

    def setup(self, model_dir: str) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        config = AutoConfig.from_pretrained(model_dir)
        self.siglip = "siglip" in config.model_type  # the pipeline's test
        text_config = getattr(config, "text_config", None)
        self.max_text_tokens = int(getattr(text_config, "max_position_embeddings", 0) or 0)

    def tokenized(self, sequences: list[str], truncate: bool = False):
        """Texts tokenised as the pipeline tokenises its hypotheses (`truncate`: CLIP's cut to its text context)."""
        options = SIGLIP_TEXT if self.siglip else {"padding": True}
        if truncate and not self.siglip and self.max_text_tokens:
            options = {**options, "truncation": True, "max_length": self.max_text_tokens}
        return self.tokenizer(sequences, return_tensors="pt", **options)

    def texts(self, labels: tuple[str, ...], template: str):
        """The labels in the template, tokenised as the pipeline does (a label too long for the text model: refused)."""
        batch = self.tokenized([template.format(label) for label in labels])
        if self.max_text_tokens and batch["input_ids"].shape[1] > self.max_text_tokens:
            longest = max(labels, key=len)
            raise RequestError(
                f"{interface.CANDIDATE_LABELS}: {template.format(longest)[:80]!r} is {batch['input_ids'].shape[1]} tokens, "
                f"more than this model's text context of {self.max_text_tokens}: use shorter labels"
            )
        return batch.to(self.device)

    def check_labels(self, labels: tuple[str, ...], template: str) -> None:
        """Raise RequestError when the labels do not fit the text model (model.py: per request)."""
        self.texts(labels, template)

    def run(
        self,
        images: list[Any],
        candidate_labels: tuple[str, ...] = (),
        hypothesis_template: str = interface.DEFAULT_HYPOTHESIS_TEMPLATE,
        embed: str = "",
        **_: Any,
    ) -> dict[str, np.ndarray]:
        """Per image its labels; `embed` "images": per image its embedding, "texts": `images` are texts, per text its."""
        if embed:
            return self.embeddings(images, embed == "texts")
        images = self.as_images(images)
        labels = list(candidate_labels)
        text = self.texts(candidate_labels, hypothesis_template)
        with self.torch.inference_mode():
            logits = self.model(**text, pixel_values=self.pixels(images)).logits_per_image.float().cpu()
        rows = [self.pipeline.postprocess({"candidate_labels": labels, "logits": logits[i : i + 1]}) for i in range(len(images))]
        return self.answers(rows)

    def embeddings(self, rows: list[Any], texts: bool) -> dict[str, np.ndarray]:
        """The model's image or text features (texts: tokenised as its hypotheses are, CLIP's cut to its context),
        L2-normalised as its logits normalise them, and each text's tokens (an image: 0)."""
        torch = self.torch
        with torch.inference_mode():
            if texts:
                batch = self.tokenized(rows, truncate=True).to(self.device)
                features = self.model.get_text_features(**batch)
                mask = batch["attention_mask"] if "attention_mask" in batch else batch["input_ids"] != self.tokenizer.pad_token_id
                tokens = mask.sum(dim=1).cpu().numpy().astype(np.int32)
            else:
                features = self.model.get_image_features(pixel_values=self.pixels(self.as_images(rows)))
                tokens = np.zeros(len(rows), dtype=np.int32)
            vectors = torch.nn.functional.normalize(features.float(), dim=-1).cpu().numpy()
        return {interface.EMBEDDING: vectors.astype(np.float32), interface.PROMPT_TOKENS: tokens}
