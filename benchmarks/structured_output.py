"""Issue 44: constrained decoding on the shipped SmolLM2 through the OpenAI gateway (`make serve` first): 20 prompts x 3
JSON schemas with `response_format: json_schema` -> how many answers parse and validate against their schema, and
what the mask costs -- generated tokens/s and the inter-token latency (decoding time per token after the first piece:
the per-token cost, which the answers' different lengths do not bias) of the same prompts constrained and free,
interleaved round by round at each concurrency on a sample of the prompts (one run, so the machine's noise falls on
both). The load generator shares the machine's cores with the server and the gateway.

A free answer is capped at the length of the same prompt's constrained answer (`--free-length matched`, the default):
a JSON answer is shorter than the free text, and at a fixed concurrency shorter answers mean more prefills per decoded
token, which would be charged to the mask. `same-max` gives both `--max-tokens` instead (the earlier measurement).

    make serve OVERLAY=benchmarks/generation-2cpu/structured-overlay.yaml   (SmolLM2 may answer 256 tokens)
    .venv/bin/python benchmarks/structured_output.py [--model smollm2] [--concurrency 1 8] [--rounds 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hf2triton.config import load_project  # noqa: E402

NAME = {"type": "string", "minLength": 1, "maxLength": 40}
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130}, "city": NAME},
        "required": ["name", "age", "city"],
        "additionalProperties": False,
    },
    "review": {
        "type": "object",
        "properties": {
            "sentiment": {"enum": ["positive", "negative", "neutral"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "is_question": {"type": "boolean"},
        },
        "required": ["sentiment", "confidence", "is_question"],
        "additionalProperties": False,
    },
    "shopping": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"name": NAME, "quantity": {"type": "integer", "minimum": 1, "maximum": 99}},
                    "required": ["name", "quantity"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
}
SUBJECTS = [
    "a baker in Lyon", "a retired sailor", "a student of physics", "a nurse in Osaka", "a jazz pianist",
    "a farmer in Kenya", "a software engineer", "a painter in Madrid", "a chess champion", "a librarian",
    "a pilot from Oslo", "a chef in Lima", "a marathon runner", "a beekeeper", "a bus driver in Rome",
    "a violin maker", "a museum guard", "a surfer in Sydney", "a teacher in Quebec", "a mountain guide",
]  # fmt: skip
PROMPTS = {
    "person": "Invent {} and answer with their name, age and city as JSON.",
    "review": "Someone wrote a short review about {}. Classify its sentiment as JSON.",
    "shopping": "Write the shopping list of {} as JSON.",
}


def run_cell(client, model: str, requests: list[dict], concurrency: int) -> dict:
    """All `requests` through `concurrency` clients, streamed; generated tokens/s over the cell's wall time, and each
    answer's inter-token latency (its decoding time after the first piece per later token: the mask's cost per token,
    free of the request's fixed costs -- gateway, Triton, prefill -- which shorter answers would spread over fewer tokens)."""

    def one(body: dict) -> dict:
        started = time.perf_counter()
        first = last = None
        pieces, finish, tokens = [], None, 0
        for chunk in client.chat.completions.create(model=model, stream=True, stream_options={"include_usage": True}, **body):
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                if choice.delta.content:
                    last = time.perf_counter()
                    first = first or last
                    pieces.append(choice.delta.content)
                finish = choice.finish_reason or finish
        itl = (last - first) / (tokens - 1) if first is not None and tokens > 1 else None
        return {"text": "".join(pieces), "finish": finish, "tokens": tokens, "seconds": time.perf_counter() - started, "itl_s": itl}

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(one, requests))
    wall = time.perf_counter() - started
    tokens = sum(a["tokens"] for a in answers)
    return {
        "concurrency": concurrency,
        "requests": len(answers),
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2),
        "ms_per_token_p50": round(statistics.median(a["seconds"] / max(a["tokens"], 1) for a in answers) * 1000, 2),
        "itl_ms_p50": round(statistics.median(a["itl_s"] for a in answers if a["itl_s"] is not None) * 1000, 3),
        "tokens_per_answer": round(tokens / len(answers), 1),
        "answers": answers,
    }


def validity(cell: dict, kinds: list[str]) -> dict:
    import jsonschema

    valid, cut, problems = 0, 0, []
    for answer, kind in zip(cell["answers"], kinds):
        if answer["finish"] == "length":
            cut += 1
            continue
        try:
            jsonschema.validate(json.loads(answer["text"]), SCHEMAS[kind])
            valid += 1
        except (ValueError, jsonschema.ValidationError) as err:
            problems.append(f"{kind}: {type(err).__name__}: {str(err)[:120]} in {answer['text'][:120]!r}")
    return {"valid": valid, "cut_by_max_tokens": cut, "invalid": problems}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--check-max-tokens", type=int, default=256, help="max_tokens of the validity run")
    parser.add_argument("--speed-prompts", type=int, default=12, help="prompts per speed cell (all schemas)")
    parser.add_argument("--free-length", choices=["matched", "same-max"], default="matched", help="free answers' max_tokens")
    parser.add_argument("--base-url", default="", help="another OpenAI server (vllm serve: http://HOST:PORT/v1)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    from openai import OpenAI

    project = load_project(args.config)
    host, key = project.openai.bind_host(project.server.host), os.environ.get(project.openai.api_key_env) or "none"
    client = OpenAI(base_url=args.base_url or f"http://{host}:{project.openai.port}/v1", api_key=key, timeout=600)
    kinds = [kind for kind in SCHEMAS for _ in SUBJECTS]
    messages = [[{"role": "user", "content": PROMPTS[kind].format(subject)}] for kind in SCHEMAS for subject in SUBJECTS]
    common = {"max_tokens": args.max_tokens, "temperature": 0}
    constrained = [
        {
            "messages": m,
            "response_format": {"type": "json_schema", "json_schema": {"name": k, "schema": SCHEMAS[k], "strict": True}},
            **common,
        }
        for m, k in zip(messages, kinds)
    ]
    run_cell(client, args.model, constrained[:2], 1)  # warm-up: the grammars' first compile, the first requests
    long = {"max_tokens": args.check_max_tokens}  # the validity run: room for every answer to finish
    checked = run_cell(client, args.model, [{**r, **long} for r in constrained], max(args.concurrency))
    checked["validity"] = validity(checked, kinds)
    print(f"all {len(constrained)} constrained requests at c{max(args.concurrency)}: valid {checked['validity']['valid']}", flush=True)
    if args.free_length == "matched":  # as many tokens as the constrained answer (greedy: the same one in the speed cells)
        lengths = [max(1, min(args.max_tokens, answer["tokens"])) for answer in checked["answers"]]
        free = [{"messages": m, **common, "max_tokens": length} for m, length in zip(messages, lengths)]
    else:
        free = [{"messages": m, **common} for m in messages]
    # the mask's cost: the same prompts constrained and free, interleaved round by round (every third: all schemas)
    sample = slice(None, None, max(1, len(constrained) // args.speed_prompts))
    cells = []
    for concurrency in args.concurrency:
        for round_ in range(args.rounds):
            for variant, requests in (("constrained", constrained[sample]), ("free", free[sample])):
                cell = run_cell(client, args.model, requests, concurrency)
                cell.update(variant=variant, round=round_ + 1)
                figures = f"{cell['tokens_per_s']} tokens/s, {cell['tokens']} tokens, {len(requests)} requests"
                print(f"c{concurrency} round {round_ + 1} {variant}: {figures}", flush=True)
                cells.append(cell)
    lines = []
    for concurrency in args.concurrency:

        def median(key: str, concurrency: int = concurrency) -> dict[str, float]:
            """Per variant, the median over rounds of a cell figure."""
            return {
                v: round(statistics.median(c[key] for c in cells if c["concurrency"] == concurrency and c["variant"] == v), 3)
                for v in ("constrained", "free")
            }

        rate, per_token, itl, length = (median(key) for key in ("tokens_per_s", "ms_per_token_p50", "itl_ms_p50", "tokens_per_answer"))
        ratio = rate["constrained"] / rate["free"]
        lines.append(
            f"c{concurrency}: constrained {rate['constrained']} vs free {rate['free']} tokens/s (medians of {args.rounds} rounds) = "
            f"{ratio:.3f}x; ms per token p50 {per_token['constrained']} vs {per_token['free']}; inter-token latency p50 "
            f"{itl['constrained']:.2f} vs {itl['free']:.2f} ms = {itl['free'] / itl['constrained']:.3f}x the free decoding speed; "
            f"tokens per answer {length['constrained']} vs {length['free']} (free answers: {args.free_length})"
        )
    valid, cut = checked["validity"]["valid"], checked["validity"]["cut_by_max_tokens"]
    total = len(constrained)
    lines.append(f"valid JSON: {valid}/{total} answers ({cut} cut by max_tokens {args.check_max_tokens}, {total - valid - cut} invalid)")
    print("\n".join(lines))
    if args.out:
        for cell in cells:
            cell["answers"] = cell["answers"][:3] + [{"...": f"{len(cell['answers']) - 3} more"}]
        record = {"summary": lines, "schemas": SCHEMAS, "validity": checked, "speed_cells": cells}
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0 if valid + cut == total else 1


if __name__ == "__main__":
    sys.exit(main())
