"""A checkpoint's own per-step generation settings (its generation_config.json: n-gram blocking, repetition
penalty, minimum length, forced first / last tokens, banned and suppressed tokens) applied to each running row
of a continuous batcher, with transformers' own LogitsProcessor classes in generate()'s order, so a greedy row
gets exactly generate(num_beams=1)'s tokens. A model that sets none of them costs nothing (`StepSettings.read`
returns None).

Standard library + transformers (imported when a batcher starts): copied next to model.py with the batchers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property

# the generation_config.json fields applied per decoding step, in the order generate() applies them
STEP_FIELDS = (
    "repetition_penalty",
    "no_repeat_ngram_size",
    "bad_words_ids",
    "min_length",
    "min_new_tokens",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "suppress_tokens",
    "begin_suppress_tokens",
)


def checkpoint_generation_config(model, model_dir: str):
    """The generation config generate() applies: the torch model's own, else (an ONNX Runtime decoder) the saved
    generation_config.json; None without one."""
    from transformers import GenerationConfig

    config = getattr(model, "generation_config", None)
    if isinstance(config, GenerationConfig):
        return config
    try:
        return GenerationConfig.from_pretrained(model_dir)
    except OSError:
        return None


@dataclass(frozen=True)
class StepSettings:
    """The per-step settings a checkpoint sets (None / empty: not set), read once when the model loads."""

    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    bad_words_ids: tuple = ()
    min_length: int | None = None
    min_new_tokens: int | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: tuple = ()
    suppress_tokens: tuple = ()
    begin_suppress_tokens: tuple = ()
    eos_ids: tuple = field(default=(), compare=False)

    @classmethod
    def read(cls, generation_config, eos_ids: set[int]) -> StepSettings | None:
        """The settings `generation_config` sets that change a step's logits (generate()'s no-op values, such as
        repetition_penalty 1.0 and min_length 0, are left out); None when it sets none."""
        if generation_config is None:
            return None
        values = {name: getattr(generation_config, name, None) for name in STEP_FIELDS}
        if values["repetition_penalty"] == 1.0:
            values["repetition_penalty"] = None
        for name in ("no_repeat_ngram_size", "min_length", "min_new_tokens"):
            values[name] = values[name] or None
        forced = values["forced_eos_token_id"]
        values["forced_eos_token_id"] = tuple(forced if isinstance(forced, list) else [forced] if forced is not None else [])
        values["bad_words_ids"] = tuple(tuple(ids) for ids in values["bad_words_ids"] or ())
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            values[name] = tuple(values[name] or ())
        settings = cls(**values, eos_ids=tuple(sorted(eos_ids)))
        return settings if settings != cls() else None

    def describe(self) -> str:
        """'no_repeat_ngram_size 3, min_length 56, ...': the settings set, for the server log."""
        unset = StepSettings()
        shown = [
            f"{f.name} {_short(getattr(self, f.name))}"
            for f in fields(self)
            if f.compare and getattr(self, f.name) != getattr(unset, f.name)
        ]
        return ", ".join(shown)

    def processors(self, prompt_length: int, max_length: int, device="cpu"):
        """transformers' LogitsProcessorList for a row whose decoder input started `prompt_length` tokens long and
        may reach `max_length` tokens (generate()'s max_length: the input plus max_new_tokens)."""
        import transformers as t

        eos = list(self.eos_ids)
        chain = []
        if self.repetition_penalty is not None:
            chain.append(t.RepetitionPenaltyLogitsProcessor(self.repetition_penalty))
        if self.no_repeat_ngram_size:
            chain.append(t.NoRepeatNGramLogitsProcessor(self.no_repeat_ngram_size))
        if self.bad_words_ids:
            chain.append(t.NoBadWordsLogitsProcessor([list(ids) for ids in self.bad_words_ids], eos))
        if self.min_length and eos:
            chain.append(t.MinLengthLogitsProcessor(self.min_length, eos, device=device))
        if self.min_new_tokens and eos:
            chain.append(t.MinNewTokensLengthLogitsProcessor(prompt_length, self.min_new_tokens, eos, device=device))
        if self.forced_bos_token_id is not None:
            chain.append(t.ForcedBOSTokenLogitsProcessor(self.forced_bos_token_id))
        if self.forced_eos_token_id:
            chain.append(t.ForcedEOSTokenLogitsProcessor(max_length, list(self.forced_eos_token_id), device=device))
        if self.suppress_tokens:
            chain.append(t.SuppressTokensLogitsProcessor(list(self.suppress_tokens), device=device))
        if self.begin_suppress_tokens:
            chain.append(t.SuppressTokensAtBeginLogitsProcessor(list(self.begin_suppress_tokens), prompt_length, device=device))
        return t.LogitsProcessorList(chain)

    def apply(self, torch, rows: list, logits, decoder_ids) -> object:
        """`logits` [rows, vocabulary] with each row's processors applied (a new tensor; the raw logits stay for
        log-probabilities). `decoder_ids(sequence)`: (the row's decoder input so far, its length at the start)."""
        if self.penalty_only:  # a chat model's one setting: the whole batch at once
            return self._penalised(torch, rows, logits, decoder_ids)
        return self.per_row(torch, rows, logits, decoder_ids)

    @cached_property
    def penalty_only(self) -> bool:
        """Whether repetition_penalty is the only setting (decided once, not at every decoding step)."""
        return self.repetition_penalty is not None and replace(self, repetition_penalty=None) == StepSettings()

    def per_row(self, torch, rows: list, logits, decoder_ids) -> object:
        """`apply` with transformers' processor chain built and run for each row (any settings)."""
        out = logits.clone()
        for index, sequence in enumerate(rows):
            ids, start = decoder_ids(sequence)
            chain = self.processors(start, start + sequence.sampling.max_new_tokens, logits.device)
            out[index : index + 1] = chain(torch.tensor([ids], dtype=torch.long, device=logits.device), out[index : index + 1])
        return out

    def _penalised(self, torch, rows: list, logits, decoder_ids) -> object:
        """transformers' RepetitionPenaltyLogitsProcessor on every row in one gather and scatter (the same values):
        each row's ids padded with its first one, which a repeat leaves as it is."""
        ids = [decoder_ids(sequence)[0] for sequence in rows]
        width = max(len(row) for row in ids)
        padded = torch.tensor([row + row[:1] * (width - len(row)) for row in ids], dtype=torch.long).to(logits.device)
        score = logits.gather(1, padded)
        score = torch.where(score < 0, score * self.repetition_penalty, score / self.repetition_penalty)
        return logits.scatter(1, padded, score)


def _short(value) -> str:
    if isinstance(value, tuple) and len(value) == 1 and not isinstance(value[0], tuple):
        return str(value[0])
    text = str(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= 40 else text[:37] + "..."
