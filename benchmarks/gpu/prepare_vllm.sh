#!/usr/bin/env bash
# Prepare, here, the wheels that vLLM needs on the H200 (no network and no package registry there; at most 64 MiB
# travels with one `device` call). Run from the repository root; needs network access to PyPI:
#
#     bash benchmarks/gpu/prepare_vllm.sh [ASSETS]   # -> ASSETS/vllm/call1 ... callN (default .gpu-assets, git-ignored)
#
# What it gathers: cp312 / manylinux x86_64 wheels of vllm==0.22.1 (VLLM=... to change; EXTRA_ROOTS, default
# torch-c-dlpack-ext, beside it) and of every runtime dependency the H200 image lacks, resolved from the wheels' own
# METADATA (Requires-Dist, markers evaluated for CPython 3.12 on Linux x86_64; vllm's own extras are not taken;
# extras a requirement names, like fastapi[standard] or mistral_common[image], are, as pip would). One version per
# package: the newest that satisfies every requirement on it, re-chosen until nothing moves; where no version
# satisfies them all, an older version of the package that asked for the odd one out is tried (vllm pins
# apache-tvm-ffi==0.1.9, xgrammar >= 0.2.6 needs >= 0.1.10: xgrammar steps down). Not carried:
#   - what the image has (KINDS.md's package list, 2026-11-17; ON_IMAGE below). Where its version was read there
#     (KNOWN), it is held like a pin: a package that refuses it is stepped down too (xgrammar 0.2.5.post1 says
#     transformers<5: xgrammar 0.2.3); only vllm's own requirements would make another version be carried, and
#     IMAGE_WINS keeps the image's even then (numpy, see there). Where its version was not read, it is assumed
#     to fit (the 2026-12-02 run served with the image's own); those requirements are listed in resolution.txt;
#   - what vLLM 0.22.1 imports only for kernels/loaders a Llama model does not use (SKIP below; measured on the
#     H200 2026-12-02, shared/reference/performance-facts.md): flashinfer (then VLLM_USE_FLASHINFER_SAMPLER=0),
#     tilelang, quack, cutlass-dsl, humming, tokenspeed, fastsafetensors, cudnn-frontend (benchmarks only); numba
#     and opencv are the image's own.
# Every wheel's bytes are cut into pieces packed into call folders of at most LIMIT_MIB (50) each, in order, the last
# call the only one not full; vllm/call1/MANIFEST.json lists, per file ("vllm-wheels/NAME.whl"), its pieces in order,
# its bytes and its sha256, in the format `benchmarks/gpu/device.sh setup` joins and checks. Piece names start with
# "vllm-wheels__", so they never collide with prepare.sh's; the MANIFEST.json name does: stash these calls into a
# store of their own (not /tmp/gpu-assets/pieces beside prepare.sh's). On the machine, install them into an
# environment of their own over the image's (as device.sh does for /tmp/v: a venv plus a .pth to the image's
# site-packages for torch, transformers, numpy): DIR/bin/python -m pip install --no-index --no-deps STORE/vllm-wheels/*.whl
# ASSETS/vllm/wheels.txt and resolution.txt say what was carried and why.
set -euo pipefail
ASSETS=${1:-.gpu-assets}
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
VLLM=${VLLM:-vllm==0.22.1}
LIMIT_MIB=${LIMIT_MIB:-50}  # + the repository copy (~7.4 MiB) stays under the 64 MiB a call carries
OUTDIR="$ASSETS/vllm"
WORK="$OUTDIR/.build"
rm -rf "$OUTDIR"/call* "$WORK"
mkdir -p "$WORK/wheels"

PLATFORMS=()
for tag in manylinux_2_39 manylinux_2_38 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
  manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done
PLATFORMS+=(--platform any)

# Resolve and download into $WORK/wheels; writes $OUTDIR/resolution.txt.
"$PY" - "$WORK/wheels" "$OUTDIR/resolution.txt" "$VLLM" "${PLATFORMS[@]}" <<'PY'
import os
import re
import subprocess
import sys
import zipfile
from collections import defaultdict
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename

wheels, report_path, root, platforms = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4:]
PIP = [sys.executable, "-m", "pip"]
DOWNLOAD = ["download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            *platforms, "-d", str(wheels)]

# The H200 image ('cuda', KINDS.md, 2026-11-17): every package it lists; version where one was read there
# (KINDS.md's pip list row, shared/reference/environment.md), else None.
KNOWN = {"accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "onnx": "1.23.1",
         "onnxruntime": "1.30.0", "safetensors": "0.8.0", "sentencepiece": "0.2.2", "tiktoken": "0.14.0",
         "tokenizers": "0.23.2", "torch": "2.11.0", "torchaudio": "2.11.0", "torchvision": "0.26.0",
         "transformers": "5.17.0", "triton": "3.6.0", "grpcio": "1.84", "protobuf": "7.36", "cupy-cuda13x": "14.2.0",
         "jax": "0.11.2", "jaxlib": "0.11.2", "sentence-transformers": "6.0.1"}
ON_IMAGE = dict.fromkeys("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub
humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping
jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx
onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
ON_IMAGE.update(KNOWN)
# Not needed to serve a Llama-architecture model with vLLM 0.22.1 (the H200, 2026-12-02), and large.
SKIP = {name: why for why, names in {
    "flashinfer: set VLLM_USE_FLASHINFER_SAMPLER=0": "flashinfer-python flashinfer-cubin flashinfer-jit-cache",
    "kernels a Llama model does not use": "tilelang quack-kernels nvidia-cutlass-dsl nvidia-cutlass-dsl-libs-base "
                                          "nvidia-cutlass-dsl-libs-cu13 humming-kernels tokenspeed-mla",
    "optional loader": "fastsafetensors",
    "imported by vllm's flash-attention benchmarks only": "nvidia-cudnn-frontend",
}.items() for name in names.split()}

env = default_environment()
env.update(python_version="3.12", python_full_version="3.12.3", implementation_name="cpython",
           implementation_version="3.12.3", platform_python_implementation="CPython", platform_machine="x86_64",
           platform_system="Linux", sys_platform="linux", os_name="posix")


def metadata_requires(path):
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(archive.read(name).decode())
    return [Requirement(raw) for raw in message.get_all("Requires-Dist") or []]


def applies(req, extras):
    return req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in {"", *extras})


# Where the image's version was read (KNOWN), it is held like a pin: a carried package whose requirement refuses it
# is passed over for an older version of that package (e.g. xgrammar 0.2.5.post1+ says transformers<5 or
# apache-tvm-ffi>=0.1.10, so xgrammar 0.2.3); only vllm's own requirements make the image's version be carried
# instead. IMAGE_WINS: the image's version is kept against every requirement, vllm's too. numpy: mistral_common >= 1.11.2 says
# numpy<2.4 on Python <= 3.12 (every release up to 1.13.1, and vllm needs >= 1.11.2); carrying an older numpy
# would shadow the image's for torch and everything else; the 2026-12-02 run served with the image's 2.5.2.
IMAGE_WINS = {"numpy"}
ROOT = Requirement(root)
# Not a requirement of anything, carried as the 2026-12-02 run did (0.9 MB): apache-tvm-ffi (xgrammar) imports it
# when torch lacks __dlpack_c_exchange_api__, and JIT-compiles its own addon at import when that fails too
# (torch-c-dlpack-ext 0.1.5 ships addons for torch 2.4-2.9 only). EXTRA_ROOTS="" leaves it out.
EXTRA_ROOTS = [Requirement(r) for r in os.environ.get("EXTRA_ROOTS", "torch-c-dlpack-ext").split()]


def pip(args, show_errors=True):
    done = subprocess.run(PIP + args, capture_output=True, text=True)
    text = "\n".join(line for line in (done.stdout + done.stderr).splitlines()
                     if "it is neither a file nor a directory" not in line)
    if done.returncode != 0 and show_errors:
        print(text, flush=True)
    return done.returncode, text


chosen = {}  # name -> (Version, Path)
carry = {}  # on the image, but vllm needs another version: carried like the rest (it will shadow the image's)
exclude = defaultdict(SpecifierSet)  # versions that conflicted with another package's requirement
for round_number in range(1, 60):
    specs, extras, askers, reqs_on = defaultdict(SpecifierSet), defaultdict(set), defaultdict(set), defaultdict(list)
    assumed, skipped, image_ok, overridden, passed_over = defaultdict(set), defaultdict(set), {}, {}, []
    stack, expanded = [(ROOT, None)] + [(r, None) for r in EXTRA_ROOTS], set()
    while stack:
        req, asker = stack.pop()
        name = canonicalize_name(req.name)
        label = "(root)" if asker is None else f"{asker} {chosen[asker][0]}"
        askers[name].add(f"{label}: {req}")
        if name in SKIP:
            skipped[name].add(label)
            continue
        if name in ON_IMAGE and name not in carry:
            version = ON_IMAGE[name]
            if version is None:
                if str(req.specifier):
                    assumed[name].add(f"{req.specifier} ({label})")
                continue
            if req.specifier.contains(version, prereleases=True):
                image_ok.setdefault(name, version)
                continue
            if name in IMAGE_WINS:
                overridden.setdefault(f"{name} {version}", set()).add(f"{label} says {req.specifier}")
                continue
            if asker not in (None, canonicalize_name(ROOT.name)):
                passed_over.append(f"{label} needs {name}{req.specifier}, the image has {version}")
                exclude[asker] &= SpecifierSet(f"!={chosen[asker][0]}")
                continue
            carry[name] = f"the image has {version}, {label} needs {req.specifier}"
        specs[name] &= req.specifier & exclude[name]
        reqs_on[name].append((asker, req.specifier))
        extras[name] |= {canonicalize_name(e) for e in req.extras}
        if name in chosen and chosen[name][0] in specs[name] and (name, frozenset(extras[name])) not in expanded:
            expanded.add((name, frozenset(extras[name])))
            stack.extend((r, name) for r in metadata_requires(chosen[name][1]) if applies(r, extras[name]))
    if passed_over:  # walk again with those versions excluded
        print("prepare_vllm: trying older versions: " + "; ".join(passed_over), flush=True)
        continue
    for name in sorted(n for n in chosen if n not in specs):  # no longer reachable with the versions chosen now
        chosen.pop(name)[1].unlink()
    wanted = sorted(n for n in specs if n not in chosen or chosen[n][0] not in specs[n])
    if not wanted:
        break
    print(f"prepare_vllm: round {round_number}: fetching {len(wanted)}: {' '.join(wanted)}", flush=True)
    for name in wanted:
        if name in chosen:
            chosen.pop(name)[1].unlink()
    before = set(wheels.glob("*.whl"))
    lines = {name: f"{name}{specs[name]}" for name in wanted}
    if pip(DOWNLOAD + list(lines.values()), show_errors=False)[0] != 0:  # find the line(s) that failed, and why
        for name, line in lines.items():
            rc, text = pip(DOWNLOAD + [line], show_errors=False)
            if rc == 0:
                continue
            found = re.search(r"from versions: ([^)]*)\)", text)
            versions = [v.strip() for v in found.group(1).split(",")] if found and found.group(1) != "none" else []
            if "from versions: none" not in text and not versions:
                sys.exit(f"prepare_vllm: pip could not download {line}:\n{text}")
            if versions:  # a conflict: try older versions of the packages that asked for what no version gives
                culprits = []
                for index, (asker, _) in enumerate(reqs_on[name]):
                    others = exclude[name]
                    for other_index, (_, specifier) in enumerate(reqs_on[name]):
                        if other_index != index:
                            others &= specifier
                    if asker is not None and asker != canonicalize_name(ROOT.name) and list(others.filter(versions)):
                        culprits.append(asker)
                if not culprits:
                    sys.exit(f"prepare_vllm: no version of {name} fits all of: " + "; ".join(sorted(askers[name])))
                for asker in culprits:
                    print(f"prepare_vllm: {asker} {chosen[asker][0]} needs a version of {name} ({line}) no other "
                          f"requirement allows: trying an older {asker}", flush=True)
                    exclude[asker] &= SpecifierSet(f"!={chosen[asker][0]}")
                continue
            print(f"prepare_vllm: {line} has no cp312 wheel: building one from its sdist (pure Python only)")
            if pip(["wheel", "-q", "--no-deps", "--no-binary", ":all:", "-w", str(wheels), line])[0] != 0:
                sys.exit(f"prepare_vllm: {line}: no wheel and no sdist that builds")
            if any(not p.name.endswith("-none-any.whl") for p in set(wheels.glob("*.whl")) - before):
                sys.exit(f"prepare_vllm: {line} built a platform wheel here: it would not fit CPython 3.12")
    for path in set(wheels.glob("*.whl")) - before:  # pip chose them for the tags above
        name, version, _, _ = parse_wheel_filename(path.name)
        chosen[name] = (version, path)
else:
    sys.exit("prepare_vllm: the versions did not settle in 60 rounds")

out = [f"# {root}: {len(chosen)} wheels carried (CPython 3.12, linux x86_64)", ""]
for name in sorted(chosen):
    version, path = chosen[name]
    out.append(f"{path.name}  {path.stat().st_size / 2**20:.1f} MiB  <- " + "; ".join(sorted(askers[name])))
out += ["", "# On the image in a version read there that fits (not carried)"]
out += [f"{n} {v}" for n, v in sorted(image_ok.items()) if n not in carry]
out += ["", "# On the image, version not read: assumed to fit these requirements (not carried)"]
out += [f"{n}: " + "; ".join(sorted(s)) for n, s in sorted(assumed.items())]
out += ["", "# On the image in a version vllm refuses: carried"] + [f"{n}: {w}" for n, w in sorted(carry.items())]
out += ["", "# On the image in a version a carried package's metadata refuses: the image's kept (IMAGE_WINS)"]
out += [f"{n}: " + "; ".join(sorted(w)) for n, w in sorted(overridden.items())]
out += ["", "# Versions passed over (they conflicted with another requirement)"]
out += [f"{n}{s}" for n, s in sorted(exclude.items()) if str(s)]
out += ["", "# Left out on purpose"] + [f"{n} ({SKIP[n]}) <- {', '.join(sorted(a))}" for n, a in sorted(skipped.items())]
report_path.write_text("\n".join(out) + "\n")
print(f"prepare_vllm: {len(chosen)} wheels resolved ({report_path})")
PY

# Cut the wheels' bytes into pieces, fill call folders of LIMIT_MIB in order, write the manifest.
"$PY" - "$WORK/wheels" "$OUTDIR" "$LIMIT_MIB" <<'PY'
import hashlib
import json
import sys
from pathlib import Path

wheels, outdir, limit = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) << 20
files = sorted(wheels.glob("*.whl"), key=lambda p: (not p.name.startswith("vllm-"), p.name))
manifest, calls, room = {}, [[]], limit
for path in files:
    data = path.read_bytes()
    relative = f"vllm-wheels/{path.name}"
    entry = manifest[relative] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "pieces": []}
    start = 0
    while start < len(data) or not entry["pieces"]:
        if room == 0:
            calls.append([])
            room = limit
        chunk = data[start : start + room]
        name = f"{relative.replace('/', '__')}.part{len(entry['pieces']):03d}"
        entry["pieces"].append(name)
        calls[-1].append((name, chunk))
        start += len(chunk)
        room -= len(chunk)
for number, chunks in enumerate(calls, 1):
    folder = outdir / f"call{number}"
    folder.mkdir(parents=True)
    for name, chunk in chunks:
        (folder / name).write_bytes(chunk)
(outdir / "call1" / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
total = sum(e["bytes"] for e in manifest.values())
lines = [f"{p.name}  {p.stat().st_size / 2**20:.2f} MiB" for p in files]
(outdir / "wheels.txt").write_text("\n".join(lines) + f"\n# {len(files)} wheels, {total / 2**20:.1f} MiB\n")
print(f"prepare_vllm: {len(files)} wheels, {total / 2**20:.1f} MiB, in {sum(len(c) for c in calls)} pieces "
      f"-> {len(calls)} call folders under {outdir}/ (list: {outdir}/wheels.txt)")
for number, chunks in enumerate(calls, 1):
    print(f"  call{number}: {sum(len(c) for _, c in chunks) / 2**20:.1f} MiB, {len(chunks)} pieces")
PY
[ -n "${KEEP_WHEELS:-}" ] || rm -rf "$WORK"
