"""Issue 44 #4 without a server: the gateway's mapping of response_format / guided_* / structured_outputs to the model's
GUIDED input and its 400s, the model's check of that input, and constrained decoding in the torch batchers (causal on
both caches, and the text2text Seq2SeqBatcher) on tiny random models -- whose output parses only because of the mask."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import jsonschema
import pytest

from hf2triton.gateway.errors import ApiError
from hf2triton.gateway.protocol import generation_options
from hf2triton.serving import interface
from hf2triton.serving.batching.continuous import ContinuousBatcher
from hf2triton.serving.batching.seq2seq import Seq2SeqBatcher
from hf2triton.serving.batching.sequences import Guided, Sampling, Sequence
from hf2triton.serving.batching.slots import SlotBatcher
from hf2triton.serving.inputs import RequestError, guided_option
from hf2triton.triton import client
from tests.helpers import load_gpu_script, tiny_bart, tiny_llama, tiny_t5
from tests.test_continuous_batching import Collector

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "colour", "ok"],
    "additionalProperties": False,
}


def guided(body: dict) -> dict | None:
    return generation_options(body).get(interface.GUIDED)


def test_openai_and_vllm_forms_map_to_the_guided_input():
    wrapped = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    assert guided({"response_format": wrapped}) == {"kind": "json_schema", "value": SCHEMA}
    assert guided({"response_format": {"type": "json_object"}}) == {"kind": "json_object", "value": None}
    assert guided({"response_format": {"type": "text"}}) is None
    assert guided({"guided_json": json.dumps(SCHEMA)}) == {"kind": "json_schema", "value": SCHEMA}
    assert guided({"guided_regex": "[0-9]{3}"}) == {"kind": "regex", "value": "[0-9]{3}"}
    assert guided({"guided_choice": ["a", "b"]}) == {"kind": "choice", "value": ["a", "b"]}
    assert guided({"guided_grammar": 'root ::= "x" | "y"'}) == {"kind": "grammar", "value": 'root ::= "x" | "y"'}
    assert guided({"structured_outputs": {"regex": "a+"}}) == {"kind": "regex", "value": "a+"}
    assert guided({"structured_outputs": {"json_object": True}}) == {"kind": "json_object", "value": None}
    # on the wire: one JSON object in a BYTES tensor, as the model reads it back
    arrays = {name: array for name, _, array in client.input_arrays(["x"], {interface.GUIDED: {"kind": "choice", "value": ["é"]}}, True)}
    assert guided_option(arrays[interface.GUIDED], 1000) == Guided("choice", ["é"])


@pytest.mark.parametrize(
    ("body", "param", "named"),
    [
        ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
            "response_format",
            "strin",
        ),
        ({"guided_json": {"type": "string", "pattern": "(?<=a)b"}}, "guided_json", "Lookbehind"),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"guided_regex": "(?<=a)b"}, "guided_regex", "Lookbehind"),
        ({"guided_regex": ""}, "guided_regex", "non-empty"),
        ({"guided_choice": []}, "guided_choice", "non-empty list"),
        ({"guided_choice": ["a", 1]}, "guided_choice", "strings"),
        ({"guided_grammar": "root ::= foo"}, "guided_grammar", 'Rule "foo" is not defined'),
        ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs", "true or false"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "one constraint"),
    ],
)
def test_malformed_conflicting_or_uncompilable_constraints_are_400s_naming_them(body, param, named):
    with pytest.raises(ApiError) as info:
        generation_options(body)
    assert info.value.status == 400 and info.value.param == param and named in info.value.message, info.value.message


@pytest.mark.parametrize(
    "raw",
    ["nope", '{"kind": "xml", "value": 1}', '{"kind": "regex", "value": 3}', '{"kind": "choice", "value": []}', '{"kind": "json_schema"}'],
)
def test_the_model_checks_the_guided_input_shape(raw):
    import numpy as np

    with pytest.raises(RequestError, match=interface.GUIDED):
        guided_option(np.array([raw.encode()], dtype=np.object_), 1000)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    import torch
    import transformers

    torch.manual_seed(0)
    path = tiny_llama(tmp_path_factory.mktemp("llama"), 256)
    return transformers.AutoModelForCausalLM.from_pretrained(path).eval(), transformers.AutoTokenizer.from_pretrained(path)


def run(batcher, prompt_ids: list[int], **samplings: Sampling) -> dict[str, tuple[Collector, Sequence]]:
    found = {}
    for name, sampling in samplings.items():
        collector = Collector()
        sequence = Sequence(prompt_ids, sampling, collector)
        batcher.submit(sequence)
        found[name] = (collector, sequence)
    while not batcher.idle:
        batcher.step()
    return found


@pytest.mark.parametrize("kind", [ContinuousBatcher, SlotBatcher], ids=["dynamic-cache", "slots"])
def test_guided_rows_follow_their_grammar_next_to_free_ones(llama, kind):
    """One batch: a schema (greedy and two seeded samples, each its own matcher), a regex, a choice and a free row;
    the guided ones finish "stop" with text that validates, the free one runs to max_new_tokens; the reported
    log-probabilities are the model's raw log-softmax, not the masked distribution's."""
    import torch

    model, tokenizer = llama
    batcher = kind(model, tokenizer, "cpu", max_sequences=8, max_queue=8, context=256)
    ids = tokenizer("Describe a person as JSON:", add_special_tokens=False)["input_ids"]
    schema = Guided("json_schema", SCHEMA)
    found = run(
        batcher,
        ids,
        greedy=Sampling(max_new_tokens=200, guided=schema, logprobs=0),
        sample1=Sampling(max_new_tokens=200, temperature=1.0, seed=1, guided=schema),
        sample2=Sampling(max_new_tokens=200, temperature=1.0, seed=2, guided=schema),
        regex=Sampling(max_new_tokens=20, temperature=1.0, seed=3, guided=Guided("regex", "[0-9]{3}-[a-z]{2}")),
        choice=Sampling(max_new_tokens=20, temperature=1.0, seed=4, guided=Guided("choice", ["yes", "no", "maybe so"])),
        free=Sampling(max_new_tokens=12),
        cut=Sampling(max_new_tokens=3, guided=schema),
    )
    for name in ("greedy", "sample1", "sample2"):
        collector = found[name][0]
        assert collector.finish.reason == "stop", (name, collector.text)
        jsonschema.validate(json.loads(collector.text), SCHEMA)
    assert found["sample1"][0].text != found["sample2"][0].text, "each sample decodes on its own"
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", found["regex"][0].text) and found["regex"][0].finish.reason == "stop"
    assert found["choice"][0].text in ("yes", "no", "maybe so")
    assert found["free"][0].finish.reason == "length"
    cut = found["cut"][0]  # max_tokens ends it first: "length", and the text is where the grammar was
    assert cut.finish.reason == "length" and found["greedy"][0].text.startswith(cut.text), cut.text
    greedy = found["greedy"][1]
    chosen = [item.id for item in greedy.logprobs]
    with torch.inference_mode():
        raw = model(torch.tensor([ids + chosen])).logits[0, len(ids) - 1 : -1].float().log_softmax(-1)
    expected = raw.gather(-1, torch.tensor(chosen)[:, None])[:, 0].tolist()
    assert max(abs(a.logprob - b) for a, b in zip(greedy.logprobs, expected)) < 1e-4


def test_an_uncompilable_grammar_is_the_requests_error(llama):
    model, tokenizer = llama
    batcher = ContinuousBatcher(model, tokenizer, "cpu", max_sequences=2, max_queue=2, context=256)
    with pytest.raises(RequestError, match="Lookbehind"):
        batcher.submit(Sequence([1, 2], Sampling(max_new_tokens=4, guided=Guided("regex", "(?<=a)b")), Collector()))
    assert batcher.idle


def test_text2text_batcher_follows_a_schema(tmp_path):
    import transformers

    path = tiny_bart(tmp_path / "bart")
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    batcher = Seq2SeqBatcher(model, tokenizer, "cpu", max_sequences=4, max_queue=4, context=256)
    ids = tokenizer("summarize: the dragon met the knight", add_special_tokens=True)["input_ids"]
    schema = Guided("json_schema", SCHEMA)
    found = run(
        batcher, ids, a=Sampling(max_new_tokens=200, guided=schema), b=Sampling(max_new_tokens=200, temperature=1.0, seed=5, guided=schema)
    )
    for collector, _ in found.values():
        assert collector.finish.reason == "stop", collector.text
        jsonschema.validate(json.loads(collector.text), SCHEMA)


def test_a_grammar_the_vocabulary_cannot_write_is_refused_or_ends_that_sequence(tmp_path):
    """T5's vocabulary has no "{": a JSON schema is refused when submitted; a regex that needs one after "ab" ends its
    sequence with an error saying so, and the row beside it goes on (an all -inf row would have failed the batch)."""
    import transformers

    path = tiny_t5(tmp_path / "t5")
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    batcher = Seq2SeqBatcher(model, tokenizer, "cpu", max_sequences=4, max_queue=4, context=256)
    ids = tokenizer("summarize: the dragon met the knight")["input_ids"]
    with pytest.raises(RequestError, match="cannot start with any token of this model's vocabulary"):
        batcher.submit(Sequence(ids, Sampling(max_new_tokens=20, guided=Guided("json_schema", SCHEMA)), Collector()))
    found = run(batcher, ids, dead=Sampling(max_new_tokens=20, guided=Guided("regex", "ab\\{")), free=Sampling(max_new_tokens=5))
    dead = found["dead"][0].finish
    assert dead.reason == "error" and "allows no token of this model's vocabulary after 'ab'" in dead.message, dead
    assert found["free"][0].finish.reason == "length"


def test_backend_vllm_takes_the_constraint_as_its_structured_outputs():
    """runtimes/vllm.py: GUIDED -> StructuredOutputsParams keywords (vLLM 0.22.1 compiles them with its own xgrammar)."""
    from hf2triton.serving.runtimes.vllm import structured_outputs

    assert structured_outputs(None) is None
    assert structured_outputs(Guided("json_schema", SCHEMA)) == {"json": SCHEMA}
    assert structured_outputs(Guided("json_object")) == {"json_object": True}
    assert structured_outputs(Guided("regex", "a+")) == {"regex": "a+"}
    assert structured_outputs(Guided("choice", ["a", "b"])) == {"choice": ["a", "b"]}
    assert structured_outputs(Guided("grammar", 'root ::= "a"')) == {"grammar": 'root ::= "a"'}


def test_cli_flags_become_the_guided_input(tmp_path):
    from hf2triton.errors import UserError
    from hf2triton.triton.commands import guided_flag

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    assert guided_flag(str(schema), None) == {"kind": "json_schema", "value": SCHEMA}
    assert guided_flag(None, "a+") == {"kind": "regex", "value": "a+"} and guided_flag(None, None) is None
    (tmp_path / "list.json").write_text("[1]")
    for path, regex, message in (
        (str(schema), "a", "both"),
        (str(tmp_path / "none.json"), None, "cannot read"),
        (str(tmp_path / "list.json"), None, "no JSON object"),
    ):
        with pytest.raises(UserError, match=message):
            guided_flag(path, regex)


@pytest.mark.parametrize("rows", [[0, 1, 2, 3], [1, 3]], ids=["every-row", "some-rows"])
def test_the_cpu_mask_equals_xgrammars_kernel(rows):
    """grammar._mask_on_cpu (numpy's unpacking, one masked_fill) forbids exactly the tokens xgrammar's own kernel does,
    on the guided rows only, for a vocabulary that is not a multiple of 32."""
    import torch
    import xgrammar as xgr

    from hf2triton.serving.batching.grammar import _mask_on_cpu

    width = 1000
    generator = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, (width + 31) // 32), dtype=torch.int32, generator=generator)
    logits = torch.randn(4, width, generator=generator)
    ours, theirs = logits.clone(), logits.clone()
    _mask_on_cpu(torch, ours, bitmask, rows, width)
    xgr.apply_token_bitmask_inplace(theirs, bitmask, vocab_size=width, indices=rows, backend="torch_native")
    assert torch.equal(ours, theirs)
    untouched = [row for row in range(4) if row not in rows]
    assert torch.equal(ours[untouched], logits[untouched]) and ours.isinf().any()


def test_the_mask_reuses_one_bitmask_and_stale_rows_change_nothing(llama):
    """Grammars.mask writes into one host bitmask at every step (a new 196 KB tensor per step was an mmap and a munmap
    each): a step after another with more or other guided rows masks exactly what a fresh Grammars does, the free rows'
    logits untouched; the buffer grows only for more rows."""
    import torch

    from hf2triton.serving.batching.grammar import Grammars

    model, tokenizer = llama
    vocabulary = model.config.vocab_size

    def sequences(kinds: list[str | None]) -> list[SimpleNamespace]:
        grammars = Grammars(tokenizer, vocabulary, {tokenizer.eos_token_id})
        return [SimpleNamespace(matcher=grammars.matcher(Guided(kind)) if kind else None) for kind in kinds]

    reused = Grammars(tokenizer, vocabulary, {tokenizer.eos_token_id})
    logits = torch.randn(4, vocabulary, generator=torch.Generator().manual_seed(0))
    reused.mask(torch, sequences(["json_object"] * 4), logits)  # every row written once
    buffer = reused.bitmask.data_ptr()
    for kinds in ([None, "json_object", None, None], ["json_object", None], [None, None, None, "json_object"]):
        rows = sequences(kinds)
        got = reused.mask(torch, rows, logits[: len(kinds)])
        want = Grammars(tokenizer, vocabulary, {tokenizer.eos_token_id}).mask(torch, rows, logits[: len(kinds)])
        assert torch.equal(got, want), kinds
        free = [index for index, kind in enumerate(kinds) if kind is None]
        assert torch.equal(got[free], logits[free]) and got.isinf().any()
    assert reused.bitmask.data_ptr() == buffer, "the same buffer at every step"
    reused.mask(torch, sequences(["json_object"] * 6), torch.randn(6, vocabulary))
    assert reused.bitmask.shape[0] >= 6, "grown for more rows"


def test_decode_probe_guided_cells_run_free_and_constrained_rows(llama, monkeypatch):
    """benchmarks/gpu/decode_probe.py --guided (the GPU host's breakdown of the constrained step's cost), on the CPU:
    both medians measured, the constrained run profiled."""
    probe = load_gpu_script("decode_probe", monkeypatch)  # it imports generation_bench from its own directory
    model, tokenizer = llama
    ids = [tokenizer("Hello there", add_special_tokens=False)["input_ids"], tokenizer("A person", add_special_tokens=False)["input_ids"]]
    (cell,) = probe.guided_cells(model, tokenizer, ids, [2], 24, device="cpu")
    assert cell["rows"] == 2 and cell["ms_per_full_step_free"] > 0 and cell["ms_per_full_step_guided"] > 0, cell
    assert "function calls" in cell["guided_profile"] and cell["free_over_guided"] > 0
    loops = cell["closed_loop_free"], cell["closed_loop_guided"]
    assert all(loop["tokens_per_s"] > 0 for loop in loops) and cell["closed_loop_guided_over_free_tokens_per_s"] > 0, cell
