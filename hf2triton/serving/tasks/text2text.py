"""text2text-generation (encoder-decoder models: T5, Flan-T5, BART, Marian; summarization and translation too):
the text in, the generated text out. Answered whole by transformers' generate() (`Text2TextEngine.run`), or
streamed by the encoder-decoder continuous batcher (batching/seq2seq.py) with the same options and requests as
text-generation."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from .. import interface
from ..batching.seq2seq import decoder_start_id
from ..batching.settings import StepSettings
from ..batching.text import eos_token_ids
from ..inputs import RequestError, chat_messages
from .generation import GenerationEngine

# T5's relative positions set no hard limit (its config names none): the length it was trained on
DEFAULT_CONTEXT = 512


class Text2TextEngine(GenerationEngine):
    """Greedy (temperature 0) or sampled decoding from the prompt as it is (no chat template), answered as
    transformers' pipeline(task) answers (`checkpoint_defaults`, the default): the pipeline's generation config
    (its defaults, num_beams 4, filled in by the checkpoint's generation_config.json and, for a T5 alias task,
    its task_specific_params with their prefix). Its per-step settings (n-gram blocking, minimum length, forced
    and banned tokens) apply to every answer, streamed ones too (the batcher's `settings`); its beam search to
    whole greedy answers. checkpoint_defaults false: plain decoding."""

    auto_class = interface.AUTO_CLASSES[interface.TEXT2TEXT]

    def __init__(self, model_dir: str, **kwargs: Any):
        super().__init__(model_dir, **kwargs)
        self.stop_ids = eos_token_ids(self.model, self.tokenizer)
        self.generation = CheckpointGeneration.read(
            self.model.generation_config,
            self.model.config,
            self.tokenizer.pad_token_id,
            self.stop_ids,
            self.options.get("pipeline_task") or "",
            bool(self.options.get("checkpoint_defaults", interface.DEFAULTS.checkpoint_defaults)),
        )
        self.prefix, self.checkpoint = self.generation.prefix, self.generation.config  # the prefix the pipeline adds
        self.beams, self.step_settings = self.generation.beams, self.generation.step_settings
        self.batcher_options = {"settings": self.step_settings}  # the streamed answers' per-step settings

    def describe_settings(self) -> str:
        return self.generation.describe()

    def checkpoint_max_new_tokens(self) -> int | None:
        return self.generation.max_new_tokens()

    def answers_whole(self, temperature: float) -> bool:
        """A greedy request is answered whole by generate() where the pipeline's config searches beams (beams
        do not stream)."""
        return self.beams > 1 and temperature <= 0

    def setup(self, model_dir: str) -> None:
        self.tokenizer.padding_side = "right"  # the encoder's inputs; the mask covers the padding

    def _max_length(self, model_dir: str) -> int:
        try:
            return super()._max_length(model_dir)
        except ValueError:  # neither the config nor the tokenizer names a limit
            return DEFAULT_CONTEXT

    def prompt(self, text: str) -> str:
        return self.prefix + text

    def chat_prompt(self, messages_json: list[str], tools_json: list[str] | None = None) -> str:
        """A chat request's input: its last user message (an encoder-decoder model has no conversation format)."""
        if tools_json is not None:
            raise RequestError(f"'{interface.TOOLS}': a text2text model has no chat template to render tools")
        users = [m["content"] for m in chat_messages(messages_json) if m["role"] == "user"]
        if not users:
            raise RequestError(f"'{interface.MESSAGES}' has no user message: a text2text model answers the last one")
        return self.prompt(users[-1])

    def token_ids(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt)["input_ids"]  # with the model's special tokens (T5's and BART's </s>)

    def text_ids(self, text: str, raw: bool = False) -> list[int]:
        """The encoder's input: the task's prefix and the text (no chat template to leave out, `raw` or not)."""
        return self.token_ids(self.prompt(text))

    def room(self, prompt_tokens: int) -> int:
        """The decoder's own context: the input is the encoder's."""
        return self.max_length

    def check_length(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """The input must fit the encoder and the answer the decoder (each up to the model's context)."""
        if prompt_tokens > self.max_length:
            raise RequestError(f"input of {prompt_tokens} tokens exceeds the model's context of {self.max_length} tokens")
        if max_new_tokens > self.max_length:
            raise RequestError(f"max_new_tokens={max_new_tokens} exceeds the model's context of {self.max_length} tokens")

    def _generate_torch(self, prompts: list[str], max_new_tokens: int, temperature: float) -> list[list[int]]:
        return self._generate(self.tokenizer(prompts, padding=True, return_tensors="pt"), max_new_tokens, temperature)

    def generate_ids(self, prompts_ids: list[list[int]], max_new_tokens: int, beams: bool = True) -> list[list[int]]:
        """Whole greedy answers to token-id prompts, one generate() for all (`beams`: the pipeline's beam search;
        False: one beam, the tokens the streaming batcher gives)."""
        batch = self.tokenizer.pad({"input_ids": prompts_ids}, return_tensors="pt")
        return self._generate(batch, max_new_tokens, 0.0, beams)

    def _generate(self, batch, max_new_tokens: int, temperature: float, beams: bool = True) -> list[list[int]]:
        """generate() on a tokenized batch with the pipeline's generation config (its beams for greedy answers;
        a sampled one draws one sequence with its per-step settings), or a plain one (checkpoint_defaults false)."""
        from transformers import GenerationConfig

        batch = {k: v.to(self.device) for k, v in batch.items() if k != "token_type_ids"}
        sampling = (
            {"do_sample": True, "temperature": temperature, "top_k": None, "top_p": None} if temperature > 0 else {"do_sample": False}
        )
        settings = {
            "max_new_tokens": max_new_tokens,
            "decoder_start_token_id": decoder_start_id(self.model),
            "eos_token_id": sorted(self.stop_ids),
            "pad_token_id": self.tokenizer.pad_token_id,
            **sampling,
        }
        if self.checkpoint is None:
            config = GenerationConfig(**settings)
        else:
            config = copy.deepcopy(self.checkpoint)
            config.update(**settings, **({} if beams and temperature <= 0 else {"num_beams": 1}))
        with self.torch.inference_mode():
            out = self.model.generate(**batch, generation_config=config, use_model_defaults=False)
        return out[:, 1:].tolist()  # after the decoder's start token


@dataclass(frozen=True)
class CheckpointGeneration:
    """What of a checkpoint's generation config its answers follow (read once: by the engine at load, by
    preflight from the saved files): the pipeline's generation config (None: checkpoint_defaults false), the
    prefix and settings of the alias task's task_specific_params, the per-step settings."""

    own: Any  # the checkpoint's generation config as saved
    config: Any  # the pipeline's (pipeline_generation_config); None: plain decoding
    prefix: str = ""
    task_params: dict = field(default_factory=dict)
    step_settings: StepSettings | None = None

    @classmethod
    def read(cls, own, model_config, pad_token_id, eos_ids: set[int], pipeline_task: str, use: bool) -> CheckpointGeneration:
        specific = dict((getattr(model_config, "task_specific_params", None) or {}).get(pipeline_task or interface.TEXT2TEXT) or {})
        prefix = specific.pop("prefix", "")  # Text2TextGenerationPipeline adds it to every input
        config = pipeline_generation_config(own, pad_token_id, specific) if use else None
        return cls(own, config, prefix, specific, StepSettings.read(config, eos_ids))

    @classmethod
    def from_files(cls, model_dir: str, pipeline_task: str, use: bool) -> CheckpointGeneration:
        """From a saved model's config.json and generation_config.json (no weights loaded: preflight)."""
        from transformers import AutoConfig, GenerationConfig

        model_config = AutoConfig.from_pretrained(model_dir)
        try:
            own = GenerationConfig.from_pretrained(model_dir)
        except OSError:  # none saved: from_pretrained derives it from config.json so
            own = GenerationConfig.from_model_config(model_config)
        eos = own.eos_token_id if isinstance(own.eos_token_id, list) else [own.eos_token_id]
        return cls.read(own, model_config, own.pad_token_id, {e for e in eos if e is not None}, pipeline_task, use)

    @property
    def beams(self) -> int:
        return int(self.config.num_beams or 1) if self.config is not None else 1

    def max_new_tokens(self) -> int | None:
        """The answer length the checkpoint asks for (its max_new_tokens, or its max_length less the decoder's
        start token; the alias task's when it names one); None: it names none (the configured default applies)."""
        if self.config is None:
            return None
        own = {**self.own.to_diff_dict(), **self.task_params}
        if own.get("max_new_tokens"):
            return int(own["max_new_tokens"])
        return int(own["max_length"]) - 1 if own.get("max_length") else None

    def describe(self) -> str:
        """The line the server log (and preflight) print: what the answers follow."""
        if self.config is None:
            return "t2t: checkpoint generation settings: off (generation.checkpoint_defaults: false)"
        shown = [f"prefix {self.prefix!r}"] if self.prefix else []
        shown += [f"num_beams {self.beams} (whole answers; streamed answers decode greedily)"] if self.beams > 1 else []
        shown += [self.step_settings.describe()] if self.step_settings else []
        cap = self.max_new_tokens()
        shown += [f"max_new_tokens {cap} (a request's default)"] if cap else []
        return "t2t: checkpoint generation settings: " + (", ".join(shown) or "none")


def pipeline_generation_config(own, pad_token_id: int | None, task_params: dict):
    """The generation config transformers' Text2TextGenerationPipeline (and Summarization / Translation, its
    subclasses) hands generate() for a checkpoint whose own is `own`: the pipeline's defaults (num_beams 4,
    max_new_tokens 256) where `own` leaves generate()'s, the checkpoint's max_length honoured over the default
    max_new_tokens, then the alias task's task_specific_params (pipelines/base.py, transformers 4.57). The merge is
    transformers' own (_prepare_generation_config, which reads only the model's generation_config here)."""
    from transformers import GenerationMixin, Text2TextGenerationPipeline

    default = Text2TextGenerationPipeline._default_generation_config
    holder = SimpleNamespace(generation_config=own)
    config, _ = GenerationMixin._prepare_generation_config(holder, generation_config=default, use_model_defaults=True)
    if default.max_new_tokens is not None and config.max_new_tokens == default.max_new_tokens and config.max_length not in (None, 20):
        config.max_new_tokens = None
    config.update(**task_params)
    if pad_token_id is not None and config.pad_token_id is None:
        config.pad_token_id = pad_token_id
    return config
