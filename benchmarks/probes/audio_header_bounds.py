"""What an audio file's header can make the server spend, side by side in one run: the resampling the decoder did
before 2026-12-08 (scipy's resample_poly at the exact gcd ratio: a filter of 20 x max(up, down) taps) against
audio.resample (the ratio's terms bounded), on 100 samples at usual and odd rates; and how soon decode_audio refuses
files whose header claims a rate outside 1..384 kHz or more channels x frames than max_audio_seconds of 96 kHz stereo.
Each case runs in a fresh process (its peak RSS is its own); medians of ROUNDS alternating rounds.

    .venv/bin/python benchmarks/probes/audio_header_bounds.py [ROUNDS] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

# each case: a snippet run in a fresh interpreter; prints seconds and the process's peak RSS in MB
SETUP = """
import io, math, resource, time
import numpy as np, soundfile
from scipy.signal import resample_poly
from hf2triton.serving import audio
from hf2triton.serving.inputs import RequestError
samples = np.random.default_rng(0).standard_normal(100).astype(np.float32)
def wav(rate, channels=1, frames=100, kind="WAV"):
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros((frames, channels), np.float32), rate, format=kind, subtype="FLOAT" if kind == "WAV" else None)
    return buffer.getvalue()
started = time.perf_counter()
"""
CASES = {
    "resample 44100 Hz, before (exact gcd ratio)": "g = math.gcd(44100, 16000); resample_poly(samples, 16000 // g, 44100 // g)",
    "resample 44100 Hz, now": "audio.resample(samples, 44100, 16000)",
    "resample 383987 Hz, before (exact gcd ratio)": "g = math.gcd(383987, 16000); resample_poly(samples, 16000 // g, 383987 // g)",
    "resample 383987 Hz, now (ratio bounded)": "audio.resample(samples, 383987, 16000)",
    "decode a 4,000,001 Hz header, now": (
        "raw = wav(4_000_001)\ntry: audio.decode_audio(raw, 16000, 600)\nexcept RequestError as e: refused = str(e)"
    ),
    "decode 8 channels x 9 s at 384 kHz (FLAC, max_audio_seconds 10), now": (
        "raw = wav(384000, 8, 384000 * 9, 'FLAC'); started = time.perf_counter()\n"
        "try: audio.decode_audio(raw, 16000, 10)\nexcept RequestError as e: refused = str(e)"
    ),
}
REPORT = (
    "\nprint(json.dumps({'s': time.perf_counter() - started, 'rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,"
    " 'refused': 'refused' in globals()}))"
)


def run_case(code: str) -> dict[str, float]:
    snippet = "import json\n" + SETUP + code + REPORT
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, check=True)  # noqa: S603 - our snippet
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", nargs="?", type=int, default=3)
    parser.add_argument("--out", help="write the medians as JSON here")
    args = parser.parse_args()
    seen: dict[str, list[dict[str, float]]] = {name: [] for name in CASES}
    for round_ in range(args.rounds):
        for name in list(CASES)[:: 1 if round_ % 2 == 0 else -1]:
            seen[name].append(run_case(CASES[name]))
    medians = {name: {key: round(statistics.median(r[key] for r in runs), 4) for key in ("s", "rss_mb")} for name, runs in seen.items()}
    for name, figures in medians.items():
        figures["refused"] = all(r["refused"] for r in seen[name])
        print(f"{name:70s} {figures['s'] * 1000:9.1f} ms  peak RSS {figures['rss_mb']:5.0f} MB{'  refused' if figures['refused'] else ''}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"rounds": args.rounds, "medians": medians}, handle, indent=1)


if __name__ == "__main__":
    main()
