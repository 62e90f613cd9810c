"""Continuous batching for Whisper (issue 45): the decoding steps of every audio being transcribed are one batch;
an audio joins at the next step and leaves the moment its search ends, whichever Triton batch it came in.

The served speech model still answers each request whole, as a non-decoupled model (Triton's HTTP and gRPC infer
keep working): its execute() hands the request's audios over and returns at once, and the answer goes out through
the request's response sender (python_backend >= 24.06 lets a non-decoupled model answer so), so the instance takes
the next Triton batch while this one decodes. Without it, each Triton batch was one generate() to the end: the
audios arriving meanwhile waited for its longest one, and decoding steps were never shared between batches.

Each audio's answer is its generate()'s. What generate() decodes from — the encoder's states, the decoder prompt
(<|startoftranscript|><|lang|><|task|><|notimestamps|>, the language detected where none was asked), the logits
processors, the stopping criteria, beams, length penalty, max_length — is taken from generate() itself, stopped
just before its decoding loop (`decoding_setup`). Beam search is transformers' own per audio (GenerationMixin's
_get_top_k_continuations, _get_running_beams_for_next_iteration, _update_finished_beams,
_check_early_stop_heuristic); greedy or sampled decoding stays with generate(). Only the decoder passes are shared: one
left-padded self-attention cache for all rows (an audio's beams are its rows), explicit position ids (rows stand at
different positions), and one cross-attention cache per audio (not per beam, as generate() keeps it), computed when it
joins (batching/cross_attention.py).

Standard library + torch (imported when a batcher starts): copied next to model.py with speech models.
"""

from __future__ import annotations

import collections
import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .cross_attention import attending, cross_cache, shared_cross_attention
from .seq2seq import decoder_pass

CANCEL_POLL_S = 0.5  # how often the running requests are asked whether their client left (an IPC round trip each)


class _Setup(Exception):
    """Raised instead of decoding: what generate() was about to decode from."""

    def __init__(self, mode: str, input_ids, kwargs: dict[str, Any]):
        super().__init__(mode)
        self.mode, self.input_ids, self.kwargs = mode, input_ids, kwargs


def _stop_before(mode: str):
    def decoding(self, input_ids, **kwargs):
        raise _Setup(mode, input_ids, kwargs)

    return decoding


_SETUP_CLASSES: dict[type, type] = {}


def decoding_setup(model, generate_kwargs: dict[str, Any]) -> _Setup:
    """What `model.generate(**generate_kwargs)` decodes from, got from generate() itself, run on a shallow copy of the
    model whose class's decoding methods raise _Setup with their arguments (the encoder has run, the language is
    detected, the beams expanded); execute() may be running the model's own generate() meanwhile."""
    cls = type(model)
    if cls not in _SETUP_CLASSES:
        stops = {"_beam_search": _stop_before("beams"), "_sample": _stop_before("sample")}
        _SETUP_CLASSES[cls] = type(f"{cls.__name__}Setup", (cls,), stops)
    proxy = copy.copy(model)  # the same modules and weights; the model itself stays as it is for other threads
    proxy.__class__ = _SETUP_CLASSES[cls]
    try:
        proxy.generate(**generate_kwargs)
    except _Setup as setup:
        return setup
    raise RuntimeError("generate() returned without decoding")


@dataclass(eq=False)
class Job:
    """One request's audios (their pipeline features) and where its answer goes: `done(texts, prompts, error)` once
    (prompts: each audio's decoder prompt ids, its language token among them)."""

    features: list[dict[str, Any]]
    generate: dict[str, Any]  # generate()'s options shared by the request (language, task)
    done: Callable[[list[str] | None, list[list[int]] | None, str], None]
    cancelled: Callable[[], bool] = lambda: False
    texts: list[str | None] = field(default_factory=list)
    prompts: list[list[int] | None] = field(default_factory=list)
    left: int = 0
    ended: bool = False

    def __post_init__(self) -> None:
        self.texts, self.prompts, self.left = [None] * len(self.features), [None] * len(self.features), len(self.features)


@dataclass(eq=False)
class Search:
    """One audio's beam search as generate() runs it (batch size 1): `beams` rows of the running batch."""

    job: Job
    index: int  # which audio of the job
    setup: _Setup
    beams: int
    cur_len: int
    prompt_len: int
    state: dict[str, Any] = field(default_factory=dict)  # the search's tensors, by _beam_search's names
    done: Any = None  # a 0-d bool tensor after each step (read for all searches at once)
    together: Any = None  # what lets searches step together (_together); None: transformers' helpers, alone
    features: Any = None  # the audio's whole input features [1, mels, frames] (a next segment starts at `seek`)
    prompt: Any = None  # its decoder prompt, one row per beam (every segment starts from it)
    seek: int = 0  # input frames before this segment
    segments: list = field(default_factory=list)  # the tokens of the segments before this one


class WhisperBatcher:
    """The running batch of a Whisper model's audios. `submit(job)` from any thread; `run_forever` on one."""

    def __init__(self, model, answer: Callable[[Any], str], device: str, max_audios: int, log: Callable[[str], None] = print):
        import torch

        self.torch, self.model, self.answer, self.device, self.max_audios, self.log = torch, model, answer, device, max_audios, log
        self.vocab = model.config.get_text_config().vocab_size
        self.waiting: collections.deque[tuple[Job, int]] = collections.deque()
        self.running: list[Search] = []
        self.lock = threading.Condition()
        self.stopped = False
        self.cache: list = []  # self-attention (keys, values) per layer, [rows, heads, length, dim], left-padded
        self.cross: list = []  # cross-attention (keys, values) per layer, [audios, heads, frames, dim]: a row per search
        self.mask = None  # [rows, length] 1 = a real decoder token
        self.asked = time.monotonic()
        self.resuming: list[Search] = []  # audios whose next 30 s segment starts at the next step
        self.joining: list[tuple[Job, int]] = []  # this step's joining audios, until they run (fail_all answers them)
        self.tensors: dict[tuple, tuple] = {}  # per `together` key: its token ids on the device
        encoder = model.get_encoder()
        self.input_stride = encoder.conv1.stride[0] * encoder.conv2.stride[0]
        self.segment_frames = self.input_stride * model.config.max_source_positions
        shared_cross_attention(model)

    # ------------------------------------------------------------------ requests in

    def submit(self, job: Job) -> None:
        with self.lock:
            self.waiting.extend((job, index) for index in range(len(job.features)))
            self.lock.notify()

    def run_forever(self) -> None:
        while True:
            with self.lock:
                while not self.stopped and not (self.waiting or self.running or self.resuming):
                    self.lock.wait()
                if self.stopped:
                    break
            try:
                self.step()
            except Exception as err:  # noqa: BLE001 - a failed pass ends its requests, not the loop
                self.fail_all(f"transcription failed: {type(err).__name__}: {err}")
        self.fail_all("the model is being unloaded")  # nothing handed over stays unanswered

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.lock.notify_all()

    def step(self) -> None:
        """Audios join (up to max_audios decoding), then one decoding step for every running audio."""
        self._drop_cancelled()
        with self.lock:
            room = self.max_audios - len(self.running) - len(self.resuming)  # a next segment holds its audio's place
            self.joining = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
        with self.torch.inference_mode():
            groups: dict[tuple, list[tuple[Job, int]]] = {}
            for job, index in self.joining:  # audios asking the same options share one setup (one encoder pass)
                if not job.ended:
                    groups.setdefault(tuple(sorted(job.generate.items())), []).append((job, index))
            for members in groups.values():
                self._join(members)
            self.joining = []
            while self.resuming:
                self._resume(self.resuming[0])
                self.resuming.pop(0)  # after it joined: a failed one is answered by fail_all
            if self.running:
                self._decode()

    # ------------------------------------------------------------------ joining

    def _join(self, members: list[tuple[Job, int]]) -> None:
        torch = self.torch
        features = {key: torch.cat([job.features[index][key] for job, index in members]) for key in members[0][0].features[members[0][1]]}
        setup = decoding_setup(self.model, {**features, **members[0][0].generate})
        if setup.mode != "beams":  # SpeechEngine.steps_options lets only beam search in
            raise RuntimeError(f"generate() chose {setup.mode} decoding: only beam search is decoded in steps")
        input_ids = setup.input_ids
        beams = input_ids.shape[0] // len(members)
        searches = []
        for row, (job, index) in enumerate(members):
            search = self._search(job, index, setup, beams, input_ids[row * beams : (row + 1) * beams])
            search.features = job.features[index]["input_features"]
            searches.append(search)
        states = setup.kwargs.pop("encoder_outputs").last_hidden_state  # held by no search once its caches are made
        self._start(searches, input_ids, states[::beams])  # generate() repeated each audio's states per beam

    def _resume(self, previous: Search) -> None:
        """The audio's next segment (generate()'s seek loop: the answer's timestamps ended short of the window):
        the features from `seek` on, padded to a window, through the encoder; the decoding from the same prompt."""
        torch = self.torch
        segment = previous.features[:, :, previous.seek : previous.seek + self.segment_frames]
        segment = torch.nn.functional.pad(segment, (0, self.segment_frames - segment.shape[-1]))
        encoder = self.model.get_encoder()
        states = encoder(input_features=segment.to(encoder.conv1.weight.dtype)).last_hidden_state
        search = self._search(previous.job, previous.index, previous.setup, previous.beams, previous.prompt)
        search.features, search.seek, search.segments = previous.features, previous.seek, previous.segments
        self._start([search], previous.prompt, states)

    def _start(self, searches: list[Search], input_ids, states) -> None:
        """The joining searches' first decoder pass (their prompts; the cross-attention caches from `states`, a row per
        search), their first step, and their rows after the running ones."""
        torch = self.torch
        rows = input_ids.shape[0]
        mask = torch.ones(input_ids.shape, dtype=torch.long, device=self.device)
        positions = torch.arange(input_ids.shape[1], device=self.device).expand(rows, -1)
        cross = cross_cache(self.model, states)
        logits, cache = self._pass(searches, input_ids, mask, positions, [], cross)
        offset = self.mask.shape[0] if self.running else 0
        self._merge(searches, cache, cross, mask)
        self._advance(searches, logits, offset)

    def _search(self, job: Job, index: int, setup: _Setup, beams: int, prompt) -> Search:
        """A joining audio's search state, as _beam_search initialises it for a batch of one."""
        torch = self.torch
        config = setup.kwargs["generation_config"]
        prompt_len = prompt.shape[1]
        search = Search(job, index, setup, beams, prompt_len, prompt_len, prompt=prompt, together=_together(setup))
        max_length = config.max_length
        eos = config._eos_token_tensor
        fill = config._pad_token_tensor or eos[0] if eos is not None else -1
        running = torch.full((1, beams, max_length), fill_value=fill, dtype=torch.int64, device=self.device)
        running[:, :, :prompt_len] = prompt[None]
        scores = torch.zeros((1, beams), dtype=torch.float, device=self.device)
        scores[:, 1:] = -1e9
        indices = torch.full((1, beams, max_length - prompt_len), fill_value=-1, dtype=torch.int32, device=self.device)
        keep = max(2, 1 + (eos.shape[0] if eos is not None else 0)) * beams
        search.state.update(
            running_sequences=running,
            sequences=running.clone(),
            running_beam_scores=scores,
            beam_scores=torch.full((1, beams), fill_value=-1e9, dtype=torch.float, device=self.device),
            is_sent_finished=torch.zeros((1, beams), dtype=torch.bool, device=self.device),
            is_early_stop_heuristic_unsatisfied=torch.ones((1, 1), dtype=torch.bool, device=self.device),
            running_beam_indices=indices,
            beam_indices=indices.clone(),
            beams_to_keep=keep,
            top_num_beam_mask=torch.cat((torch.ones(beams, dtype=torch.bool), torch.zeros(keep - beams, dtype=torch.bool))).to(self.device),
        )
        return search

    def _merge(self, searches: list[Search], cache: list, cross: list, mask) -> None:
        """Append the joining rows; the shorter side's self-attention cache is left-padded."""
        torch = self.torch
        if not self.running:
            self.running, self.cache, self.cross, self.mask = list(searches), cache, cross, mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        # layer by layer, in place: one old layer at a time beside the merged caches (a whole new list beside the old
        # one took twice the memory and, with a cross-attention cache per beam, ran an H100 out of memory)
        for layer, ((k0, v0), (k1, v1)) in enumerate(zip(self.cache, cache)):
            self.cache[layer] = (torch.cat([_pad_left(torch, k0, width), _pad_left(torch, k1, width)]),
                                 torch.cat([_pad_left(torch, v0, width), _pad_left(torch, v1, width)]))  # fmt: skip
        for layer, ((k0, v0), (k1, v1)) in enumerate(zip(self.cross, cross)):
            self.cross[layer] = (torch.cat([k0, k1]), torch.cat([v0, v1]))
        self.mask = torch.cat([_pad_left(torch, self.mask, width), _pad_left(torch, mask, width)])
        self.running += searches

    # ------------------------------------------------------------------ decoding

    def _pass(self, searches: list[Search], input_ids, mask, positions, cache: list, cross: list):
        """One decoder pass of `searches`' rows: the last position's logits and the grown self-attention cache. The
        cross-attention reads `cross` (a row per search) through shared_cross_attention; the encoder states the
        decoder is given are a placeholder it does not read."""
        inputs = {"decoder_input_ids": input_ids, "decoder_attention_mask": mask, "decoder_position_ids": positions}
        states = cross[0][0].new_zeros((input_ids.shape[0], 1, self.model.config.d_model))
        with attending(cross, [search.beams for search in searches]):
            logits, cache, _ = decoder_pass(self.model, cache, [], states, **inputs)
        return logits, cache

    def _decode(self) -> None:
        torch = self.torch
        rows = self.mask.shape[0]
        last = torch.cat([_last_tokens(s) for s in self.running])[:, None]
        mask = torch.cat([self.mask, self.mask.new_ones((rows, 1))], dim=1)
        positions = torch.tensor([s.cur_len - 1 for s in self.running for _ in range(s.beams)])[:, None].to(self.device)
        logits, self.cache = self._pass(self.running, last, mask, positions, self.cache, self.cross)
        self.mask = mask
        self._advance(list(self.running), logits, offset=0)

    def _advance(self, searches: list[Search], logits, offset: int) -> None:
        """Each search of rows offset.. takes its step from its rows' logits; then the batch's rows are reordered to
        the surviving beams (the parents of each new beam) and the finished searches leave."""
        torch = self.torch
        log_probs = torch.nn.functional.log_softmax(logits, dim=-1)
        if len({s.together for s in searches}) == 1 and searches[0].together is not None:
            parents = [self._beam_steps(searches, log_probs) + offset]  # one set of tensor ops for all searches
        else:
            parents, row = [], 0  # row: in `logits`, whose first is the batch's row `offset`
            for search in searches:
                rows = slice(row, row + search.beams)
                parents.append(self._beam_step(search, log_probs[rows]) + offset + row)
                row += search.beams
        done = torch.stack([s.done for s in searches]).tolist()  # one device sync for every search
        order = torch.cat([*([torch.arange(offset, device=self.device)] if offset else []), *parents])
        finished = [s for s, ended in zip(searches, done) if ended]
        for search in finished:
            self._finish(search)
        self._reorder(order, keep=[s for s in self.running if s not in finished])

    def _beam_steps(self, searches: list[Search], log_probs):
        """One step of _beam_search for every search at once: the same arithmetic as transformers' helpers run per
        search (`_beam_step`) on tensors stacked across searches, whose lengths differ, so that a step costs the same few
        dozen tensor operations however many audios decode (one search's helpers are ~30 small operations: on a GPU,
        kernel launches by the hundred per step). Only for searches whose processors and stopping criteria are the ones
        Whisper's generate() builds for plain text (`_together`); the parents of the new beams, as batch rows."""
        torch, first = self.torch, searches[0]
        count, beams, keep = len(searches), first.beams, first.state["beams_to_keep"]
        config = first.setup.kwargs["generation_config"]
        suppress, begin_suppress, begin_index, eos, max_length = first.together[:5]
        if first.together not in self.tensors:
            self.tensors[first.together] = tuple(
                torch.tensor(ids, dtype=torch.long, device=self.device) for ids in (suppress, begin_suppress, eos)
            )
        suppress, begin_suppress, eos = self.tensors[first.together]
        state = {name: torch.cat([s.state[name] for s in searches]) for name in _STACKED}
        cur = torch.tensor([s.cur_len for s in searches], device=self.device)
        prompt_len = first.prompt_len
        vocab = log_probs.shape[-1]
        vocabulary = torch.arange(vocab, device=self.device)
        log_probs = torch.where(torch.isin(vocabulary, suppress), -float("inf"), log_probs)
        starting = [i for i, s in enumerate(searches) if s.cur_len == begin_index]
        if starting:  # SuppressTokensAtBeginLogitsProcessor: the first generated token of these searches
            rows = torch.tensor([i * beams + b for i in starting for b in range(beams)], device=self.device)
            log_probs[rows] = torch.where(torch.isin(vocabulary, begin_suppress), -float("inf"), log_probs[rows])
        log_probs = (log_probs.view(count, beams, vocab) + state["running_beam_scores"][:, :, None]).view(count, -1)
        topk_log_probs, topk_indices = torch.topk(log_probs, k=keep)
        parent, tokens = topk_indices // vocab, topk_indices % vocab
        topk_sequences = torch.take_along_dim(state["running_sequences"], parent[:, :, None], dim=1)
        topk_sequences.scatter_(2, cur[:, None, None].expand(count, keep, 1), tokens[:, :, None])
        topk_beam_indices = torch.take_along_dim(state["running_beam_indices"], parent[:, :, None], dim=1)
        topk_beam_indices.scatter_(2, (cur - prompt_len)[:, None, None].expand(count, keep, 1), parent[:, :, None].to(torch.int32))
        hits = torch.isin(tokens, eos) | (cur + 1 >= max_length)[:, None]  # EosTokenCriteria | MaxLengthCriteria
        # _get_running_beams_for_next_iteration
        running_log_probs = topk_log_probs + hits.to(torch.float32) * -1.0e9
        chosen = torch.topk(running_log_probs, k=beams)[1]
        state["running_sequences"] = torch.take_along_dim(topk_sequences, chosen[:, :, None], dim=1)
        state["running_beam_scores"] = torch.take_along_dim(running_log_probs, chosen, dim=1)
        state["running_beam_indices"] = torch.take_along_dim(topk_beam_indices, chosen[:, :, None], dim=1)
        # _update_finished_beams
        just_finished = hits & state["top_num_beam_mask"][:keep][None, :]
        scores = self._length_penalised(topk_log_probs, [s.cur_len + 1 - prompt_len for s in searches], config.length_penalty)
        full = torch.all(state["is_sent_finished"], dim=-1, keepdim=True) & (config.early_stopping is True)
        scores = scores + full.to(torch.float32) * -1.0e9
        scores = scores + (~state["is_early_stop_heuristic_unsatisfied"]).to(torch.float32) * -1.0e9
        scores = scores + (~just_finished) * -1.0e9
        merged_scores = torch.cat((state["beam_scores"], scores), dim=1)
        best = torch.topk(merged_scores, k=beams)[1]
        state["sequences"] = torch.take_along_dim(torch.cat((state["sequences"], topk_sequences), dim=1), best[:, :, None], dim=1)
        state["beam_scores"] = torch.take_along_dim(merged_scores, best, dim=1)
        merged_indices = torch.cat((state["beam_indices"], topk_beam_indices), dim=1)
        state["beam_indices"] = torch.take_along_dim(merged_indices, best[:, :, None], dim=1)
        merged_finished = torch.cat((state["is_sent_finished"], just_finished), dim=1)
        state["is_sent_finished"] = torch.take_along_dim(merged_finished, best, dim=1)
        parents = torch.take_along_dim(state["running_beam_indices"], (cur - prompt_len)[:, None, None].expand(count, beams, 1), dim=2)
        # _check_early_stop_heuristic, with the length after this step
        never = config.early_stopping == "never" and config.length_penalty > 0.0
        lengths = [(max_length if never else s.cur_len + 1) - prompt_len for s in searches]
        best_running = self._length_penalised(state["running_beam_scores"][:, :1], lengths, config.length_penalty)
        worst_finished = torch.where(state["is_sent_finished"], torch.min(state["beam_scores"], dim=1, keepdim=True)[0], -1.0e9)
        heuristic = state["is_early_stop_heuristic_unsatisfied"] & torch.any(best_running > worst_finished, dim=-1, keepdim=True)
        state["is_early_stop_heuristic_unsatisfied"] = heuristic
        # _beam_search_has_unfinished_sequences, per search
        open_beam = ~(torch.all(state["is_sent_finished"], dim=-1) & (config.early_stopping is True))
        done = ~(heuristic[:, 0] & open_beam & ~torch.all(hits, dim=-1))
        for i, search in enumerate(searches):
            search.state.update({name: value[i : i + 1] for name, value in state.items() if name != "top_num_beam_mask"})
            search.cur_len += 1
            search.done = done[i]
        rows = torch.arange(count, device=self.device)[:, None] * beams
        return (parents[:, :, 0].long() + rows).reshape(-1)

    def _length_penalised(self, scores, lengths: list[int], penalty: float):
        """`scores` [searches, n] / (each search's length ** penalty) as transformers computes it per search, with a
        Python number: on CUDA a tensor divided by a CPU scalar is multiplied by its float32 reciprocal, on the CPU
        divided by it in float32 -- the same here, so that near-ties between hypotheses end as they would alone."""
        import numpy as np

        torch = self.torch
        divisors = np.array([float(length) ** penalty for length in lengths], dtype=np.float32)
        if scores.device.type == "cuda":
            return scores * torch.from_numpy(np.float32(1.0) / divisors).to(scores.device)[:, None]
        return scores / torch.from_numpy(divisors).to(scores.device)[:, None]

    def _beam_step(self, search: Search, log_probs):
        """One step of _beam_search for this audio (transformers' own helpers, batch size 1); its beams' parent rows."""
        model, s, kw = self.model, search.state, search.setup.kwargs
        config = kw["generation_config"]
        cur, prompt_len = search.cur_len, search.prompt_len
        log_probs = kw["logits_processor"](s["running_sequences"][0, :, :cur], log_probs)
        log_probs = (log_probs + s["running_beam_scores"][0, :, None]).reshape(1, -1)
        topk_log_probs, topk_sequences, topk_indices = model._get_top_k_continuations(
            accumulated_log_probs=log_probs, running_sequences=s["running_sequences"], running_beam_indices=s["running_beam_indices"],
            cur_len=cur, decoder_prompt_len=prompt_len, do_sample=False, beams_to_keep=s["beams_to_keep"],
            num_beams=search.beams, vocab_size=self.vocab, batch_size=1,
        )  # fmt: skip
        hits = kw["stopping_criteria"](topk_sequences[0, :, : cur + 1], None).reshape(1, -1)
        s["running_sequences"], s["running_beam_scores"], s["running_beam_indices"] = model._get_running_beams_for_next_iteration(
            topk_log_probs=topk_log_probs, topk_running_sequences=topk_sequences, topk_running_beam_indices=topk_indices,
            next_token_hits_stopping_criteria=hits, num_beams=search.beams,
        )  # fmt: skip
        s["sequences"], s["beam_scores"], s["beam_indices"], s["is_sent_finished"] = model._update_finished_beams(
            sequences=s["sequences"], topk_running_sequences=topk_sequences, beam_scores=s["beam_scores"], topk_log_probs=topk_log_probs,
            beam_indices=s["beam_indices"], topk_running_beam_indices=topk_indices,
            is_early_stop_heuristic_unsatisfied=s["is_early_stop_heuristic_unsatisfied"], is_sent_finished=s["is_sent_finished"],
            next_token_hits_stopping_criteria=hits, top_num_beam_mask=s["top_num_beam_mask"], num_beams=search.beams, cur_len=cur,
            decoder_prompt_len=prompt_len, length_penalty=config.length_penalty, early_stopping=config.early_stopping,
        )  # fmt: skip
        parents = s["running_beam_indices"][0, :, cur - prompt_len].long()
        search.cur_len = cur + 1
        s["is_early_stop_heuristic_unsatisfied"] = model._check_early_stop_heuristic(
            is_early_stop_heuristic_unsatisfied=s["is_early_stop_heuristic_unsatisfied"], running_beam_scores=s["running_beam_scores"],
            beam_scores=s["beam_scores"], is_sent_finished=s["is_sent_finished"], cur_len=cur + 1, max_length=config.max_length,
            decoder_prompt_len=prompt_len, early_stopping=config.early_stopping, length_penalty=config.length_penalty,
        )  # fmt: skip
        search.done = ~model._beam_search_has_unfinished_sequences(
            s["is_early_stop_heuristic_unsatisfied"], s["is_sent_finished"], hits, config.early_stopping
        )
        return parents

    def _reorder(self, order, keep: list[Search]) -> None:
        """The batch's rows become `order` (old row of each new row) restricted to the searches in `keep`."""
        torch = self.torch
        rows, audios, old = [], [], 0
        kept = {id(s) for s in keep}
        for number, search in enumerate(self.running):
            if id(search) in kept:
                rows.append(order[old : old + search.beams])
                audios.append(number)  # its row of the cross-attention cache
            old += search.beams
        self.running = keep
        if not keep:
            self.cache, self.cross, self.mask = [], [], None
            return
        index = torch.cat(rows)
        mask = self.mask[index]
        first = int((mask.sum(0) > 0).nonzero()[0])  # leading columns that are padding in every row left
        self.mask = mask[:, first:]
        for layer, (k, v) in enumerate(self.cache):  # in place, layer by layer (as _merge)
            self.cache[layer] = (k[index][:, :, first:], v[index][:, :, first:])
        if len(audios) < self.cross[0][0].shape[0]:  # searches left: their cross-attention rows go (a copy: only then)
            audio_index = torch.tensor(audios, device=self.device)
            for layer, (k, v) in enumerate(self.cross):
                self.cross[layer] = (k[audio_index], v[audio_index])

    # ------------------------------------------------------------------ answers out

    def _finish(self, search: Search) -> None:
        """The search's answer, as generate() returns it (prompt, trailing padding and end token off), as text."""
        s, config = search.state, search.setup.kwargs["generation_config"]
        generated = int((s["beam_indices"][0, 0] + 1).bool().sum())
        tokens = s["sequences"][0, 0, : search.prompt_len + generated]
        tokens = _strip_end(tokens[search.prompt_len :], config.pad_token_id, config.eos_token_id)
        job = search.job
        if job.ended:
            return
        kept, offset = self._segment(tokens, config, min(search.features.shape[-1] - search.seek, self.segment_frames))
        search.segments.append(kept)
        search.seek += offset
        if search.seek < search.features.shape[-1]:  # generate() decodes the rest of the window as a next segment
            self.resuming.append(search)
            return
        job.texts[search.index] = self.answer(self.torch.cat(search.segments))
        job.prompts[search.index] = search.prompt[0].tolist()
        job.left -= 1
        if not job.left:
            _answer(job, job.texts, job.prompts, "", self.log)

    def _segment(self, tokens, config, frames: int) -> tuple[Any, int]:
        """generate()'s _retrieve_segment for an answer without asked timestamps: the tokens it keeps and how many
        input frames they cover. Consecutive timestamp tokens end a segment: what follows the last such pair is
        dropped, and unless the answer ends on a lone timestamp the window is covered only up to that pair's time."""
        no_timestamps = getattr(config, "no_timestamps_token_id", None)  # generate()'s timestamp_begin, as it finds it
        begin = no_timestamps + 1 if no_timestamps is not None else self.model.config.vocab_size + 1
        stamps = tokens.ge(begin)
        single_ending = stamps[-2:].tolist() == [False, True]
        pairs = (self.torch.where(stamps[:-1] & stamps[1:])[0] + 1).tolist()
        if not pairs:
            return tokens, frames
        if single_ending:
            return tokens, frames
        end = pairs[-1] + 1
        return tokens[:end], (int(tokens[end - 2]) - begin) * self.input_stride

    def _drop_cancelled(self) -> None:
        """Searches of requests whose client left end now (asked every CANCEL_POLL_S: an IPC round trip each)."""
        if time.monotonic() - self.asked < CANCEL_POLL_S:
            return
        self.asked = time.monotonic()
        gone = {id(s.job) for s in self.running if not s.job.ended and s.job.cancelled()}
        if not gone:
            return
        for search in self.running:
            if id(search.job) in gone:
                _answer(search.job, None, None, "cancelled", self.log)
        order = self.torch.arange(self.mask.shape[0], device=self.device)
        self._reorder(order, keep=[s for s in self.running if id(s.job) not in gone])

    def fail_all(self, message: str) -> None:
        """A pass failed: every running and waiting request ends with the error (the loop goes on)."""
        self.log(f"hf2triton: {message}")
        with self.lock:
            waiting, self.waiting = list(self.waiting), collections.deque()
        searches = [*self.running, *self.resuming]
        jobs = {id(job): job for job in [*(s.job for s in searches), *(job for job, _ in [*self.joining, *waiting])]}
        for job in jobs.values():
            _answer(job, None, None, message, self.log)
        self.running, self.resuming, self.joining, self.cache, self.cross, self.mask = [], [], [], [], [], None


def _answer(job: Job, texts: list[str] | None, prompts: list | None, error: str, log: Callable[[str], None]) -> None:
    """Send the job's answer once; a failed send (its client's connection closed) is logged, and never ends other
    requests or the loop."""
    if job.ended:
        return
    job.ended = True
    try:
        job.done(texts, prompts, error)
    except Exception as err:  # noqa: BLE001
        log(f"hf2triton: a transcription's answer could not be sent: {type(err).__name__}: {err}")


_STACKED = (
    "running_sequences", "sequences", "running_beam_scores", "beam_scores", "is_sent_finished",
    "is_early_stop_heuristic_unsatisfied", "running_beam_indices", "beam_indices", "top_num_beam_mask",
)  # fmt: skip


def _together(setup: _Setup) -> tuple | None:
    """The key under which searches step together (_beam_steps): the logits processors and stopping criteria Whisper's
    generate() builds for plain text -- SuppressTokens, SuppressTokensAtBegin; MaxLength, EosToken -- and their values;
    None for any other (a checkpoint's repetition penalty, n-gram blocking...): transformers' helpers, per search."""
    from transformers.generation.logits_process import SuppressTokensAtBeginLogitsProcessor, SuppressTokensLogitsProcessor
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    processors = {type(p): p for p in setup.kwargs["logits_processor"]}
    criteria = {type(c): c for c in setup.kwargs["stopping_criteria"]}
    if len(processors) != len(setup.kwargs["logits_processor"]) or len(criteria) != len(setup.kwargs["stopping_criteria"]):
        return None
    plain = {SuppressTokensLogitsProcessor, SuppressTokensAtBeginLogitsProcessor}
    if set(processors) - plain or set(criteria) != {EosTokenCriteria, MaxLengthCriteria}:
        return None
    suppress = processors.get(SuppressTokensLogitsProcessor)
    begin = processors.get(SuppressTokensAtBeginLogitsProcessor)
    config = setup.kwargs["generation_config"]
    return (
        tuple(suppress.suppress_tokens.tolist()) if suppress is not None else (),
        tuple(begin.begin_suppress_tokens.tolist()) if begin is not None else (),
        begin.begin_index if begin is not None else -1,
        tuple(criteria[EosTokenCriteria].eos_token_id.tolist()),
        criteria[MaxLengthCriteria].max_length,
        setup.input_ids.shape[1],  # the prompt's length
        config.num_beams,
        config.length_penalty,
        config.early_stopping,
    )


def _last_tokens(search: Search):
    return search.state["running_sequences"][0, :, search.cur_len - 1]


def _pad_left(torch, tensor, width: int):
    """`tensor` ([rows, length] or [rows, heads, length, dim]) with zeros prepended along its length to `width`."""
    dim = 2 if tensor.dim() == 4 else 1
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _strip_end(tokens, pad_id, eos_id):
    """generate_with_fallback's clean-up of a Whisper answer: trailing padding (one kept where padding is the end
    token), then the end token."""
    if pad_id is not None and len(tokens) and int(tokens[-1]) == pad_id:
        paddings = int((tokens == pad_id).sum()) - (1 if pad_id == eos_id else 0)
        if paddings:
            tokens = tokens[:-paddings]
    if eos_id is not None and len(tokens) and int(tokens[-1]) == eos_id:
        tokens = tokens[:-1]
    return tokens
