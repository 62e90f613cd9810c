"""`python -m hf2triton` as users run it (issue 24): Ctrl-C cancels a stream on the server at once, `--max-tokens`
must be positive, `embed` never generates, one flag (--grpc) or $HF2TRITON_CONFIG is enough outside the project
directory, `lint` on an empty directory fails, `key` shows where the client key is (never the key), and the
README's Python example runs with what `make serve` installs."""

from __future__ import annotations

import ast
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf2triton.__main__ import main
from hf2triton.triton import client
from tests.helpers import ROOT, long_context_copy, make_workflow, tiny_model_entries

LONG_CONTEXT = 16384  # an 8,000-token answer of the tiny model takes far longer than any wait below


def cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hf2triton", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


# ---------------------------------------------------------------- without a server


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_max_tokens_must_be_a_positive_integer(value, capsys):
    with pytest.raises(SystemExit) as info:
        main(["infer", "--grpc", "127.0.0.1:1", "m", "text", "--max-tokens", value])
    assert info.value.code == 2 and "argument --max-tokens:" in capsys.readouterr().err


def test_generation_flags_become_the_models_options():
    """The playground's "Copy as CLI" carries every setting (issue 42 #7): the CLI takes them all."""
    import argparse

    from hf2triton.triton.commands import generation_flags

    args = argparse.Namespace(max_tokens=5, temperature=0.0, top_p=None, seed=3, stop=["END"])
    assert generation_flags(args) == {"max_new_tokens": 5, "temperature": 0.0, "seed": 3, "stop": ["END"]}
    assert generation_flags(argparse.Namespace()) == {}, "embed and models have none"
    with pytest.raises(SystemExit):
        main(["chat", "--grpc", "127.0.0.1:1", "m", "--seed", "x"])


def test_lint_of_an_empty_directory_or_a_model_directory_fails_clearly(tmp_path):
    result = cli("lint", str(tmp_path))
    assert result.returncode == 1 and "holds no model directories" in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text('name: "m"\n')
    result = cli("lint", str(tmp_path / "m"))
    assert result.returncode == 1 and "is a model directory, not a repository" in result.stderr and str(tmp_path) in result.stderr


def test_outside_the_project_without_an_address_names_the_fix(tmp_path):
    result = cli("models", cwd=tmp_path, env={"HF2TRITON_CONFIG": ""})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "--grpc HOST:PORT" in result.stderr and "HF2TRITON_CONFIG" in result.stderr, result.stderr


def test_key_shows_the_file_and_a_curl_line_never_the_key(tmp_path):
    key_file = tmp_path / "conf" / "triton.key"
    env = {client.KEY_FILE_ENV: str(key_file), "HF2TRITON_CONFIG": ""}
    missing = cli("key", cwd=tmp_path, env=env)
    assert missing.returncode == 1 and f"the client key file {key_file} is missing" in missing.stderr, missing.stderr
    assert "make serve" in missing.stderr and "key --new" in missing.stderr and not key_file.exists(), "clients never write it"
    result = cli("key", "--new", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert key_file.stat().st_mode & 0o777 == 0o600, "private"
    assert result.stdout.splitlines()[0] == str(key_file), "the first line is the path (scripts can read it)"
    assert f'-H "hf2triton-key: $(cat {key_file})"' in result.stdout
    assert key_file.read_text().strip() not in result.stdout + result.stderr


def test_readme_python_example_imports_what_make_serve_installs():
    """`make serve` installs envs/requirements.txt (issue 24 #16: the README imported openai, a test-only package)."""
    modules = set()
    for block in re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                modules.add(node.module.split(".")[0])
    third_party = modules - set(sys.stdlib_module_names) - {"hf2triton"}
    distributions = {"tritonclient": "tritonclient[all]", "numpy": "numpy", "openai": "openai"}
    runtime = {line.split("==")[0] for line in (ROOT / "envs" / "requirements.txt").read_text().splitlines() if "==" in line}
    assert "openai" in third_party and third_party <= set(distributions), third_party
    assert {distributions[m] for m in third_party} <= runtime


# ---------------------------------------------------------------- against a real server


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_models):
    """An embedder and a tiny generator with a long context, sampled (a random model's greedy answer may end at
    once), one sequence at a time: a stream the server did not cancel would hold the only place."""
    long = long_context_copy(tiny_models["text-generation"], tmp_path_factory.mktemp("long"))
    config = json.loads((long / "config.json").read_text())
    (long / "config.json").write_text(json.dumps({**config, "max_position_embeddings": LONG_CONTEXT}))
    entries = tiny_model_entries({"feature-extraction": tiny_models["feature-extraction"], "text-generation": long})
    generation = {"max_new_tokens": 16, "max_new_tokens_limit": 8000, "max_sequences": 1, "max_queue": 1, "temperature": 1.0}
    entries[1]["generation"] = generation
    workflow = make_workflow(tmp_path_factory.mktemp("cli"), entries)
    workflow.run("serve")
    yield workflow
    workflow.stop()


def grpc_of(workflow) -> str:
    return workflow.settings().url("grpc_port")


def wait_for_output(process: subprocess.Popen, pattern: str, timeout: float = 60) -> str:
    """What the process wrote to stdout until `pattern` (a regex) matches it."""
    seen, deadline = b"", time.monotonic() + timeout
    while not re.search(pattern, seen.decode(errors="replace")):
        assert time.monotonic() < deadline and process.poll() is None, seen[-2000:]
        if select.select([process.stdout], [], [], 0.5)[0]:
            seen += os.read(process.stdout.fileno(), 65536)
    return seen.decode(errors="replace")


def assert_the_only_place_is_free(grpc: str) -> None:
    """max_sequences 1: a short request is answered at once only if the interrupted stream left the server."""
    started = time.monotonic()
    answer = client.stream_generate(grpc, "generate", "Hi", {"max_new_tokens": 4})
    assert answer["completion_tokens"] >= 1 and time.monotonic() - started < 10, "the interrupted generation still runs"


@pytest.mark.integration
def test_ctrl_c_during_infer_stream_cancels_the_generation_at_once(served):
    grpc = grpc_of(served)
    command = [sys.executable, "-m", "hf2triton", "infer", "--grpc", grpc, "generate", "A story", "--stream", "--max-tokens", "8000"]
    # Started with SIGINT ignored, as a background job of a non-interactive shell is (`bash .ci/run &`): the CLI
    # must take SIGINT back, or Python raises no KeyboardInterrupt and the stream runs on (issue 48).
    inherited = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        signal.signal(signal.SIGINT, inherited)
    try:
        wait_for_output(process, r"\S")  # the first piece
        time.sleep(0.5)
        interrupted = time.monotonic()
        process.send_signal(signal.SIGINT)
        stderr = process.communicate(timeout=15)[1].decode()  # drains stdout too: a full pipe would block the exit
        exited_after = time.monotonic() - interrupted
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 130 and "[stopped]" in stderr and "Traceback" not in stderr, stderr[-2000:]
    assert exited_after < 10, f"Ctrl-C took {exited_after:.1f} s"  # the old stop_stream() hung for good; 10 s: a loaded 2-core machine
    print(f"Ctrl-C of infer --stream (started with SIGINT ignored): exited {exited_after:.2f} s after SIGINT")
    assert_the_only_place_is_free(grpc)


@pytest.mark.integration
def test_ctrl_c_in_chat_stops_the_answer_and_the_conversation_goes_on(served):
    grpc = grpc_of(served)
    command = [sys.executable, "-m", "hf2triton", "chat", "--grpc", grpc, "generate", "--max-tokens", "8000"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        process.stdin.write(b"Tell me a story\n")
        process.stdin.flush()
        wait_for_output(process, r"generate> \s*\S")  # the first piece (a sampled answer may start with a space)
        process.send_signal(signal.SIGINT)
        wait_for_output(process, r"\[stopped\]\nyou> ", timeout=10)
        assert_the_only_place_is_free(grpc)
        process.stdin.close()  # Ctrl-D: leaves
        assert process.wait(timeout=15) == 0
    finally:
        process.kill()
        process.wait()


@pytest.mark.integration
def test_one_grpc_flag_or_the_config_variable_is_enough_anywhere(served, tmp_path):
    grpc = grpc_of(served)
    result = cli("embed", "--grpc", grpc, "embed", "hello", "world", cwd=tmp_path, env={"HF2TRITON_CONFIG": ""})
    assert result.returncode == 0, result.stderr
    assert [len(v) for v in json.loads(result.stdout)["embeddings"]] == [32, 32]
    served.write_config()
    listed = cli("models", "--json", cwd=tmp_path, env={"HF2TRITON_CONFIG": str(served.config_file)})
    assert listed.returncode == 0, listed.stderr
    assert {row["name"]: row.get("streaming") for row in json.loads(listed.stdout)} == {"embed": False, "generate": True}


@pytest.mark.integration
def test_embed_refuses_a_generation_model_without_generating(served):
    settings = served.settings()
    before = client.model_statistics(settings.url(), "generate")
    result = cli("embed", "--grpc", grpc_of(served), "generate", "hello")
    assert result.returncode == 1 and "generate is a text-generation model, not feature-extraction" in result.stderr, result.stderr
    assert client.model_statistics(settings.url(), "generate") == before, "nothing was sent to the model"


@pytest.mark.integration
def test_the_printed_curl_line_works(served, tmp_path):
    key = cli("key", "--config", str(served.config_file))
    line = next(line for line in key.stdout.splitlines() if line.startswith("curl "))
    status = subprocess.run(
        ["bash", "-c", line.replace("MODEL", "embed") + " -s -o /dev/null -w '%{http_code}'"], capture_output=True, text=True, check=False
    )
    assert status.stdout == "200", (line, status.stdout, status.stderr)
