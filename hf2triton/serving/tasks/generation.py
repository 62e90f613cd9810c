"""text-generation: one answer per prompt, in one pass per set of options (`GenerationEngine`), or streamed by a
batcher: the torch continuous batcher (hf2triton.serving.batching) or, for backend vllm, vLLM's engine
(`VllmEngine`)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import interface
from ..batching.sequences import PARTIAL_CHARACTER
from ..batching.settings import StepSettings, checkpoint_generation_config
from ..batching.text import eos_token_ids
from ..inputs import RequestError, chat_prompt
from .base import Engine

MAX_TOKENS_PER_CHARACTER = 4  # a UTF-8 character is at most 4 bytes, so at most 4 byte-level tokens


class GenerationEngine(Engine):
    """text-generation: chat template when the tokenizer has one, greedy unless temperature > 0."""

    outputs = (interface.TEXT_OUTPUT,)
    auto_class = interface.AUTO_CLASSES[interface.GENERATION]
    decoder = True

    def setup(self, model_dir: str) -> None:
        self.tokenizer.padding_side = "left"  # generation continues at the right end of every row
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model_dir = model_dir

    @functools.cached_property
    def batcher_options(self) -> dict[str, Any]:
        """What the continuous batcher takes of this model: the checkpoint's per-step settings (a chat model's
        repetition_penalty, Qwen2.5-Instruct's 1.05-1.1), so streamed answers get them as generate() -- the whole
        answers' -- and transformers' pipeline apply them."""
        config = checkpoint_generation_config(self.model, self.model_dir)
        return {"settings": StepSettings.read(config, eos_token_ids(self.model, self.tokenizer))}

    @property
    def templated(self) -> bool:
        """Whether a text prompt takes the chat template: generation.chat_template, and a tokenizer that has one."""
        return bool(self.options.get("chat_template", interface.DEFAULTS.chat_template) and getattr(self.tokenizer, "chat_template", None))

    def prompt(self, text: str) -> str:
        if self.templated:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        return text

    def text_ids(self, text: str, raw: bool = False) -> list[int]:
        """A text prompt's token ids: the chat template applied as configured, or (untemplated, or `raw`: a
        /v1/completions prompt) the text with the tokenizer's special tokens (a BOS), as transformers' pipeline and
        vLLM encode a prompt."""
        if raw or not self.templated:
            return self.tokenizer(text)["input_ids"]
        return self.token_ids(self.prompt(text))

    def chat_prompt(self, messages_json: list[str], tools_json: list[str] | None = None) -> str:
        """A chat request's prompt: the chat template over its messages and tools (a streaming request's `messages`
        and `tools`)."""
        return chat_prompt(self.tokenizer, messages_json, tools_json)

    def token_ids(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]  # a templated prompt: the template holds them

    def check_length(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise RequestError if a prompt plus max_new_tokens exceeds the model's context."""
        if prompt_tokens + max_new_tokens > self.max_length:
            raise RequestError(
                f"prompt of {prompt_tokens} tokens + max_new_tokens={max_new_tokens} exceeds the context of {self.max_length} tokens"
            )

    def room(self, prompt_tokens: int) -> int:
        """The most tokens an answer to a prompt this long can have: what the context leaves after it."""
        return max(1, self.max_length - prompt_tokens)

    def check_lengths(self, texts: list[str], max_new_tokens: int) -> None:
        """`check_length` for each of `texts`."""
        for text in texts:
            self.check_length(len(self.text_ids(text)), max_new_tokens)

    def run(
        self,
        texts: list[str],
        max_new_tokens: int = interface.DEFAULTS.max_new_tokens,
        temperature: float = interface.DEFAULTS.temperature,
        **_: Any,
    ) -> dict[str, np.ndarray]:
        prompts = [self.prompt(t) for t in texts]
        if self.backend == "onnx":  # the export's own decoder loop (OrtDecoder)
            batch = self.tokenizer(prompts, padding=True, add_special_tokens=not self.templated, return_tensors="np")
            pad_id = self.tokenizer.pad_token_id
            new_tokens = self.model.generate(batch["input_ids"], batch["attention_mask"], max_new_tokens, pad_id, temperature).tolist()
        else:
            new_tokens = self._generate_torch(prompts, max_new_tokens, temperature)
        texts_out = [self.complete_text(ids) for ids in new_tokens]
        return {interface.TEXT_OUTPUT: np.array([t.strip().encode("utf-8") for t in texts_out], dtype=np.object_)}

    def _generate_torch(self, prompts: list[str], max_new_tokens: int, temperature: float) -> list[list[int]]:
        batch = self.tokenizer(prompts, padding=True, add_special_tokens=not self.templated, return_tensors="pt")
        batch = {k: v.to(self.device) for k, v in batch.items()}
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with self.torch.inference_mode():
            out = self.model.generate(
                **batch, max_new_tokens=max_new_tokens, pad_token_id=self.tokenizer.pad_token_id, top_p=None, top_k=None, **sampling
            )
        return out[:, batch["input_ids"].shape[1] :].tolist()

    def complete_text(self, ids: list[int]) -> str:
        """Decoded text without a trailing partial character: byte-level tokens can split a multi-byte
        character, which decodes to U+FFFD when max_new_tokens cuts it; such a tail is dropped."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = 0
        while text.endswith(PARTIAL_CHARACTER) and cut < MAX_TOKENS_PER_CHARACTER and cut < len(ids):
            cut += 1
            text = self.tokenizer.decode(ids[: len(ids) - cut], skip_special_tokens=True)
        return text if not text.endswith(PARTIAL_CHARACTER) else text.rstrip(PARTIAL_CHARACTER)


class VllmEngine:
    """backend vllm: vLLM's engine generates (runtimes/vllm.py, loaded only here, inside the vLLM environment);
    requests are tokenized, templated and checked exactly as for GenerationEngine (its `prompt`, this tokenizer,
    the served context), and `batcher` takes them as the torch continuous batcher does (submit / stop)."""

    outputs = (interface.TEXT_OUTPUT,)
    templated, prompt, chat_prompt = GenerationEngine.templated, GenerationEngine.prompt, GenerationEngine.chat_prompt
    text_ids, token_ids, check_length = GenerationEngine.text_ids, GenerationEngine.token_ids, GenerationEngine.check_length
    room = GenerationEngine.room

    def __init__(self, params: interface.ModelParameters, device: str, log=print, instance: dict[str, str] | None = None):
        from transformers import AutoTokenizer

        from ..runtimes.vllm import VllmGenerator  # copied only into a backend vllm model
        from ..runtimes.vllm_frontends import frontend_of

        self.tokenizer = AutoTokenizer.from_pretrained(params.model_dir)
        self.options = {"chat_template": params.chat_template}
        self.max_length = params.max_model_len
        self.device = device
        self.batcher = VllmGenerator(params, device, log, frontend=frontend_of(instance or {}, params.frontends))
