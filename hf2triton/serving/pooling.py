"""How a sentence-transformers model makes its sentence embedding: read from its saved files (standard library only:
render, the served model and the gateway's facts come from the same reading), and the pooling itself over the
network's token states (torch, handed in by the engine; what sentence-transformers' Pooling module computes).

- modules.json lists what runs: Transformer (the network), Pooling, and Normalize only where listed: a model
  without it is not normalised. Any other module (Dense, LayerNorm, ...) is refused: it would change the
  embeddings, and hf2triton does not run it.
- The Pooling module's config (its path in modules.json, 1_Pooling/config.json): the modes, as
  `Pooling(**config)` reads them (`pooling_mode_mean_tokens` defaults to true; `pooling_mode` overrides), several
  modes concatenated in Pooling's order; `include_prompt`.
- sentence_bert_config.json: `do_lower_case` (the texts are stripped and, if set, lowercased, as its
  Transformer module does; `max_seq_length` is the engine's limit).
- config_sentence_transformers.json: `prompts` and `default_prompt_name`. "query" and "document" always exist
  (empty unless the model defines them), as in sentence-transformers 5.
- config.json's Matryoshka declaration, as vLLM reads it: `matryoshka_dimensions` (only those), else
  `is_matryoshka` (any width up to the embedding's).

A model without modules.json (a plain transformers model) is pooled as before: its 1_Pooling/config.json's mode if
it has one, else mean, L2-normalised; its texts are not stripped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

# Pooling's modes in the order it concatenates them: (short name, its config key, the key's default)
MODES = (
    ("cls", "pooling_mode_cls_token", False),
    ("max", "pooling_mode_max_tokens", False),
    ("mean", "pooling_mode_mean_tokens", True),
    ("mean_sqrt_len_tokens", "pooling_mode_mean_sqrt_len_tokens", False),
    ("weightedmean", "pooling_mode_weightedmean_tokens", False),
    ("lasttoken", "pooling_mode_lasttoken", False),
)
MODULES = ("Transformer", "Pooling", "Normalize")  # the sentence-transformers modules hf2triton runs
DEFAULT_PROMPTS = {"query": "", "document": ""}
ANY_WIDTH = "any"  # Matryoshka without a list: any width from 1 to the embedding's


@dataclass(frozen=True)
class SentenceEmbedding:
    """What a model's files say about its sentence embedding (`read`)."""

    modes: tuple[str, ...] = ("mean",)
    include_prompt: bool = True
    normalize: bool = True
    prompts: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_PROMPTS))
    default_prompt_name: str | None = None
    sentence_transformers: bool = False  # modules.json present: texts prepared as its Transformer module does
    lower_case: bool = False
    matryoshka: str = ""  # "" not declared, ANY_WIDTH, or the allowed widths "768,512,256"

    def prompt(self, name: str | None = None) -> str:
        """The text `name` prepends (None: the default prompt's, or none)."""
        name = self.default_prompt_name if name is None else name
        if name is None:
            return ""
        if name not in self.prompts:
            raise ValueError(f"prompt_name {name!r} is not one of this model's prompts: {', '.join(self.prompts)}")
        return self.prompts[name]

    def prepare(self, text: str) -> str:
        """A text as the model's Transformer module tokenises it: stripped, lowercased where configured."""
        if not self.sentence_transformers:
            return text
        text = text.strip()
        return text.lower() if self.lower_case else text

    def width(self, hidden_size: int) -> int:
        """The embedding's width: the token states' for each mode, concatenated."""
        return len(self.modes) * hidden_size


def _json(path: str, default: Any = None) -> Any:
    if not os.path.isfile(path):
        return default
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def pooling_modes(config: dict[str, Any], where: str) -> tuple[tuple[str, ...], bool]:
    """(modes in Pooling's order, include_prompt) as `Pooling(**config)` sets them."""
    flags = {key: bool(config.get(key, default)) for _, key, default in MODES}
    mode = config.get("pooling_mode")
    if mode is not None:  # a string overrides every flag
        names = [name for name, _, _ in MODES]
        if str(mode).lower() not in names:
            raise ValueError(f"{where}: pooling_mode {mode!r} is none of {', '.join(names)}")
        flags = {key: name == str(mode).lower() for name, key, _ in MODES}
    modes = tuple(name for name, key, _ in MODES if flags[key])
    if not modes:
        raise ValueError(f"{where}: no pooling mode is set (one of {', '.join(key for _, key, _ in MODES)})")
    return modes, bool(config.get("include_prompt", True))


def _matryoshka(model_dir: str) -> str:
    config = _json(os.path.join(model_dir, "config.json"), {})
    widths = config.get("matryoshka_dimensions")
    if widths:
        if not isinstance(widths, list) or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths):
            raise ValueError(f"{model_dir}/config.json: matryoshka_dimensions must be a list of positive whole numbers, got {widths!r}")
        return ",".join(str(w) for w in sorted(set(widths), reverse=True))
    return ANY_WIDTH if config.get("is_matryoshka") else ""


def read(model_dir: str) -> SentenceEmbedding:
    """The model's sentence embedding as its files describe it (ValueError naming the file when hf2triton cannot
    serve it as sentence-transformers would)."""
    modules = _json(os.path.join(model_dir, "modules.json"))
    matryoshka = _matryoshka(model_dir)
    if modules is None:  # a plain transformers model: as before (1_Pooling's mode if any, else mean; normalised)
        config = _json(os.path.join(model_dir, "1_Pooling", "config.json"))
        modes = pooling_modes(config, f"{model_dir}/1_Pooling/config.json")[0] if config else ("mean",)
        return SentenceEmbedding(modes=modes, matryoshka=matryoshka)
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] if isinstance(m, dict) else "" for m in modules] if isinstance(modules, list) else []
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]) or modules[0].get("path"):
        listed = ", ".join(str(m.get("type")) if isinstance(m, dict) else str(m) for m in modules) if isinstance(modules, list) else modules
        raise ValueError(
            f"{model_dir}/modules.json lists {listed}: hf2triton serves sentence-transformers models made of a Transformer "
            "(the model at the top of its directory), a Pooling and optionally a Normalize module -- any other would change "
            "its embeddings"
        )
    pooling_dir = os.path.join(model_dir, modules[1].get("path") or "")
    config = _json(os.path.join(pooling_dir, "config.json"))
    if not isinstance(config, dict):
        raise ValueError(f"{pooling_dir}/config.json (the Pooling module's config) is missing")
    modes, include_prompt = pooling_modes(config, f"{pooling_dir}/config.json")
    settings = _json(os.path.join(model_dir, "config_sentence_transformers.json"), {})
    prompts = dict(DEFAULT_PROMPTS)
    for name, text in (settings.get("prompts") or {}).items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise ValueError(f"{model_dir}/config_sentence_transformers.json: prompts must map names to texts, got {name!r}: {text!r}")
        if not prompts.get(name):
            prompts[name] = text
    default = settings.get("default_prompt_name") or None
    if default is not None and default not in prompts:
        raise ValueError(f"{model_dir}/config_sentence_transformers.json: default_prompt_name {default!r} is none of its prompts")
    return SentenceEmbedding(
        modes=modes,
        include_prompt=include_prompt,
        normalize=len(modules) == 3,
        prompts=prompts,
        default_prompt_name=default,
        sentence_transformers=True,
        lower_case=bool(_json(os.path.join(model_dir, "sentence_bert_config.json"), {}).get("do_lower_case")),
        matryoshka=matryoshka,
    )


def pool(torch, hidden, attention_mask, modes: tuple[str, ...], skip: int = 0):
    """Pooling's modes over `hidden` [rows, length, width] (float32, concatenated in `modes`' order), for batches
    padded on either side; no host synchronisation (it runs inside CUDA graphs).

    Each row's tokens are its mask's ones. `skip` leaves each row's first tokens out of the pooling (the prompt's,
    for include_prompt false; cls still takes the first token). Weighted mean weighs a token by its position among the
    row's tokens (1, 2, ...): Pooling's weights are positions in the padded batch, the same for right padding (and a
    text alone), but shifted by the padding for left padding -- here a text's embedding never depends on its batch."""
    hidden = hidden.float()
    real = attention_mask.bool()
    place = real.long().cumsum(1) if skip or "weightedmean" in modes else None  # 1, 2, ... at each of the row's tokens
    kept = real & (place > skip) if skip else real
    kept3 = kept.unsqueeze(-1)
    weight = kept3.float()  # sums as products with the mask: on the CPU 2-4x faster than where / masked_fill
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    pooled = []
    for mode in modes:
        if mode == "cls":  # the row's first token (position 0 when padded on the right)
            pooled.append(hidden[rows, real.int().argmax(1)])
        elif mode == "max":
            pooled.append(hidden.masked_fill(~kept3, -1e9).max(1).values)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            total, count = (hidden * weight).sum(1), weight.sum(1).clamp(min=1e-9)
            pooled.append(total / count if mode == "mean" else total / count.sqrt())
        elif mode == "weightedmean":
            weights = place.unsqueeze(-1).float() * weight
            pooled.append((hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9))
        elif mode == "lasttoken":  # the row's last kept token (none kept: zeros)
            positions = torch.arange(hidden.shape[1], device=hidden.device)
            last = torch.where(kept, positions, -1).amax(1)
            pooled.append(hidden[rows, last.clamp(min=0)] * (last >= 0).unsqueeze(-1))
        else:
            raise ValueError(f"unknown pooling mode {mode!r}")
    return pooled[0] if len(pooled) == 1 else torch.cat(pooled, 1)
