"""Long audio, two ways (issue 45, `chunk_length_s`): Whisper's sequential long-form generation (the pipeline's
default: 30 s windows one after the other, each audio alone) against the pipeline's chunking (chunks of
`--chunk` seconds overlapping by a sixth on each side, every audio's chunks decoded in one batch), both through the
served engine in-process (serving/tasks/speech.py), alternating rounds, the same audios. Prints audio seconds
transcribed per second for each, their ratio per round, and whether each answer equals the pipeline's own with the
same setting.

    .venv/bin/python benchmarks/tasks/build_media.py            # the Whisper of tiny's shape (random weights)
    .venv/bin/python benchmarks/probes/speech_chunking.py [MODEL_DIR] [--audios 4] [--seconds 90] [--chunk 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", default=str(ROOT / "benchmarks/.work/task-models/whisper"))
    parser.add_argument("--audios", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=90.0, help="each audio's length")
    parser.add_argument("--chunk", type=float, default=30.0, help="chunk_length_s of the chunked engine")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args(argv)

    from hf2triton.pipeline.audio_probes import synthetic_audio
    from hf2triton.serving import interface
    from hf2triton.serving.tasks.speech import SpeechEngine

    rate = 16000
    audios = [synthetic_audio(args.seconds, rate, seed) for seed in range(args.audios)]
    engines = {
        "sequential": SpeechEngine(args.model_dir, device=args.device),
        "chunked": SpeechEngine(args.model_dir, device=args.device, chunk_length_s=args.chunk),
    }
    total = args.audios * args.seconds
    rounds: list[dict[str, float]] = []
    answers: dict[str, list[str]] = {}
    for index in range(args.rounds):
        figures = {}
        for name in engines if index % 2 == 0 else reversed(engines):  # alternate which goes first
            started = time.perf_counter()
            texts = engines[name].run(audios)[interface.TEXT_OUTPUT]
            figures[name] = total / (time.perf_counter() - started)
            answers[name] = [t.decode("utf-8") for t in texts]
        rounds.append(figures)
        print(f"round {index + 1}: " + ", ".join(f"{k} {v:.1f} audio s/s" for k, v in figures.items())
              + f", chunked / sequential {figures['chunked'] / figures['sequential']:.2f}", flush=True)  # fmt: skip
    samples = [{"raw": a, "sampling_rate": rate} for a in audios]
    reference = {
        "sequential": _pipeline_texts(args.model_dir, samples, args.device, {}),
        "chunked": _pipeline_texts(args.model_dir, samples, args.device, {"chunk_length_s": args.chunk}),
    }
    result = {
        "model_dir": args.model_dir,
        "audios": args.audios,
        "seconds_each": args.seconds,
        "chunk_length_s": args.chunk,
        "rounds": rounds,
        "median_audio_s_per_s": {name: statistics.median(r[name] for r in rounds) for name in engines},
        "median_ratio_chunked_over_sequential": statistics.median(r["chunked"] / r["sequential"] for r in rounds),
        "equal_to_the_pipeline": {name: answers[name] == reference[name] for name in engines},
        "chunked_text_equals_sequential": answers["chunked"] == answers["sequential"],
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


def _pipeline_texts(model_dir: str, samples: list[dict], device: str, options: dict) -> list[str]:
    """transformers' own pipeline, each audio alone, on the same samples (a fresh dict per call: it pops keys)."""
    from transformers import pipeline

    recognizer = pipeline("automatic-speech-recognition", model=model_dir, device=device)
    return [recognizer(dict(sample), **options)["text"] for sample in samples]


if __name__ == "__main__":
    main()
