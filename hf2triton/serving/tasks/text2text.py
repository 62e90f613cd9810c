"""text2text-generation (encoder-decoder models: T5, Flan-T5, BART, Marian; summarization and translation too):
the text in, the generated text out. Answered whole by transformers' generate() (`Text2TextEngine.run`), or
streamed by the encoder-decoder continuous batcher (batching/seq2seq.py) with the same options and requests as
text-generation."""

from __future__ import annotations

from .. import interface
from ..batching.seq2seq import decoder_start_id
from ..batching.text import eos_token_ids
from ..inputs import RequestError, chat_messages
from .generation import GenerationEngine

# T5's relative positions set no hard limit (its config names none): the length it was trained on
DEFAULT_CONTEXT = 512


class Text2TextEngine(GenerationEngine):
    """Plain greedy (temperature 0) or sampled decoding from the prompt as it is: no chat template, and none of a
    checkpoint's own generation settings (beam search, n-gram blocking, forced tokens), which the streaming
    batcher does not apply either."""

    auto_class = interface.AUTO_CLASSES[interface.TEXT2TEXT]

    def setup(self, model_dir: str) -> None:
        self.tokenizer.padding_side = "right"  # the encoder's inputs; the mask covers the padding

    def _max_length(self, model_dir: str) -> int:
        try:
            return super()._max_length(model_dir)
        except ValueError:  # neither the config nor the tokenizer names a limit
            return DEFAULT_CONTEXT

    def prompt(self, text: str) -> str:
        return text

    def chat_prompt(self, messages_json: list[str], tools_json: list[str] | None = None) -> str:
        """A chat request's input: its last user message (an encoder-decoder model has no conversation format)."""
        if tools_json is not None:
            raise RequestError(f"'{interface.TOOLS}': a text2text model has no chat template to render tools")
        users = [m["content"] for m in chat_messages(messages_json) if m["role"] == "user"]
        if not users:
            raise RequestError(f"'{interface.MESSAGES}' has no user message: a text2text model answers the last one")
        return users[-1]

    def token_ids(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt)["input_ids"]  # with the model's special tokens (T5's and BART's </s>)

    def check_length(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """The input must fit the encoder and the answer the decoder (each up to the model's context)."""
        if prompt_tokens > self.max_length:
            raise RequestError(f"input of {prompt_tokens} tokens exceeds the model's context of {self.max_length} tokens")
        if max_new_tokens > self.max_length:
            raise RequestError(f"max_new_tokens={max_new_tokens} exceeds the model's context of {self.max_length} tokens")

    def _generate_torch(self, prompts: list[str], max_new_tokens: int, temperature: float) -> list[list[int]]:
        from transformers import GenerationConfig

        batch = self.tokenizer(prompts, padding=True, return_tensors="pt")
        batch = {k: v.to(self.device) for k, v in batch.items()}
        sampling = {"do_sample": True, "temperature": temperature, "top_k": None} if temperature > 0 else {"do_sample": False}
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            decoder_start_token_id=decoder_start_id(self.model),
            eos_token_id=sorted(eos_token_ids(self.model, self.tokenizer)),
            pad_token_id=self.tokenizer.pad_token_id,
            **sampling,
        )
        with self.torch.inference_mode():
            out = self.model.generate(**batch, generation_config=config, use_model_defaults=False)
        return out[:, 1:].tolist()  # after the decoder's start token
