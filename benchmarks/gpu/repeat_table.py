"""The table of `device.sh repeat`'s rounds: each served cell (texts per request, clients, protocol) and the
in-process yardstick, per model and round, the medians, and each model's ratio to the first one -- per round (the
models of a round ran minutes apart) and of the medians; and the in-process onnx / python ratio of each bench run.

    python benchmarks/gpu/repeat_table.py RESULTS_DIR BASE_MODEL OTHER_MODEL... > table.md
        (RESULTS_DIR holds MODEL-ROUND.json, the bench results `repeat` copies)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def rounds_of(folder: Path, model: str) -> list[dict]:
    found = [p for p in folder.glob(f"{model}-*.json") if p.stem.rsplit("-", 1) == [model, p.stem.rsplit("-", 1)[1]]]
    found = sorted((p for p in found if p.stem.rsplit("-", 1)[1].isdigit()), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    return [json.loads(path.read_text()) for path in found]


def cells(result: dict) -> dict[tuple, float]:
    """(texts per request, clients, protocol) -> items/s, served and in-process (protocol 'in-process RUNTIME')."""
    out = {(c["request_texts"], c["concurrency"], c["protocol"]): c["items_per_s"] for c in result["served"]}
    for runtime, batches in result["raw"].items():
        if isinstance(batches, dict):
            for batch, entry in batches.items():
                out[(int(batch), 1, f"in-process {runtime}")] = entry["items_per_s"]
    return out


def table(folder: Path, models: list[str]) -> str:
    per_model = {m: [cells(r) for r in rounds_of(folder, m)] for m in models}
    keys = sorted({k for rounds in per_model.values() for c in rounds for k in c}, key=lambda k: (k[2].startswith("in-process"), k))
    base = models[0]
    header = ["texts/request", "clients", "protocol"]
    for model in models:
        header.append(f"{model}: rounds")
        header.append(f"{model}: median")
    for model in models[1:]:
        header.append(f"{model} / {base}: per round")
        header.append(f"{model} / {base}: medians")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in keys:
        row = [str(key[0]), str(key[1]) if not key[2].startswith("in-process") else "-", key[2]]
        values = {m: [c.get(key) for c in per_model[m]] for m in models}
        for model in models:
            present = [v for v in values[model] if v is not None]
            row.append(" / ".join(f"{v:,.0f}" for v in present))
            row.append(f"{statistics.median(present):,.0f}" if present else "")
        for model in models[1:]:
            pairs = [(o, b) for o, b in zip(values[model], values[base], strict=False) if o and b]
            row.append(" / ".join(f"{o / b:.2f}" for o, b in pairs))
            ours, theirs = [v for v in values[model] if v], [v for v in values[base] if v]
            row.append(f"**{statistics.median(ours) / statistics.median(theirs):.2f}**" if ours and theirs else "")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "In-process, both runtimes in the same bench run (onnx / python, per round):", ""]
    for model, rounds in per_model.items():
        for batch in sorted({k[0] for c in rounds for k in c if k[2] == "in-process onnx"}):
            pairs = [
                c[(batch, 1, "in-process onnx")] / c[(batch, 1, "in-process python")] for c in rounds if (batch, 1, "in-process onnx") in c
            ]
            lines.append(f"- {model}, batch {batch}: " + " / ".join(f"{r:.2f}" for r in pairs))
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    sys.stdout.write(table(Path(sys.argv[1]), sys.argv[2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
