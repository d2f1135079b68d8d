# profiler-kit: `make demo` and `make test` are all a newcomer needs; both install first when needed.
SHELL := /bin/bash
VENV ?= .venv
# On a machine whose python already has torch & co. (e.g. a GPU box with no registry), run without the venv:
#   make nsys PY=python3 MODEL=xl CTX=256
PY ?= $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
ENV := $(if $(filter $(VENV)/bin/python,$(PY)),$(STAMP),)
# The CPU build of torch, taken only when no torch is importable (an existing CUDA torch is never replaced).
CPU_TORCH ?= torch==2.13.0

MODEL ?= xl
CTX ?= 256
MODE ?= forward
MIXED ?= 0
MIXED_FLAG := $(if $(filter 1 yes true,$(MIXED)),--mixed-precision,)

.PHONY: help install test test-gpu test-gpu-slow test-gpu-all results demo bench lint mutants nsys memory attention leaderboard clean

help:
	@echo "make demo | test | install | bench | bench-scale | lint | nsys MODEL=xl CTX=256 [MODE=train] [MIXED=1]"
	@echo "make mutants [ROOM=kernels] [MODULE=profiler_kit/kernels/noise.py] [TESTS=tests/kernels/test_noise.py]"
	@echo "make test-gpu | test-gpu-slow | test-gpu-all [ARGS='tests/attention -x']   (GPU box without the venv: PY=python3)"
	@echo "make results [ONLY=leaderboard,optimizers] [GPUS=0,1]   (GPU; ONLY=render rewrites the docs from docs/data/results)"
	@echo "make memory MODEL=xl CTX=256 [MODE=train] [MIXED=1] | attention | leaderboard"

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv --system-site-packages $(VENV)
	@$(PY) -c "import torch" 2>/dev/null \
		&& echo "torch $$($(PY) -c 'import torch; print(torch.__version__)') already present: keeping it" \
		|| $(PY) -m pip install -q "$(CPU_TORCH)"
	$(PY) -m pip install -q -e '.[dev,dask]'
	@touch $(STAMP)

install: $(STAMP)

# Tests that run nsys use the one profiler-kit finds, else Debian's 2022.4, installed into $(VENV)/nsys-debian;
# the tests that open the HTML reports in a browser use Debian's chromium, installed with apt-get when missing.
test: $(ENV)
	@$(PY) -c "from profiler_kit.nsys_tool import find_nsys; find_nsys()" 2>/dev/null \
		|| bash tools/install_nsys_debian.sh $(VENV)/nsys-debian >/dev/null \
		|| echo "no nsys found and none installed into $(VENV)/nsys-debian: the tests that run nsys will skip"
	@command -v chromium >/dev/null \
		|| { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
		|| echo "no chromium found and apt-get could not install it: the tests that open the HTML reports in a browser will skip"
	$(PY) -m pytest -q -rs -n auto

# Tests marked gpu, on a CUDA machine: the fast ones (a few minutes on one H100), then the ones marked gpu_slow
# (autotuning, torch.compile, large models, nsys recording). ARGS narrows them, e.g. ARGS=tests/attention.
# The repository first on PYTHONPATH, keeping what the caller put there (the nvtx package `.gpu/setup.sh` adds).
REPO_PATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
PYTEST_GPU := PYTHONPATH=$(REPO_PATH) $(PY) -m pytest -q -rs --durations=15
test-gpu: $(ENV)
	$(PYTEST_GPU) -m "gpu and not gpu_slow" $(ARGS)

test-gpu-slow: $(ENV)
	$(PYTEST_GPU) -m gpu_slow $(ARGS)

# Both at once, spread over every GPU of the machine (two workers per GPU, one more for the tests that need two
# GPUs; GPUS=0,1 picks them, COMMIT names the commit in results/gpu-tests/summary.json and the last line).
test-gpu-all: $(ENV)
	PYTHONPATH=$(REPO_PATH) $(PY) tools/gpu_tests.py -m gpu $(if $(GPUS),--gpus $(GPUS)) $(if $(COMMIT),--commit $(COMMIT)) $(ARGS)

# The README's and docs' GPU figures, re-run on this commit, the parts in parallel on every GPU of the machine
# (tools/results.py --list names the parts; GPUS=0,1 picks the GPUs).
results: $(ENV)
	PYTHONPATH=$(REPO_PATH) $(PY) tools/results.py $(if $(filter render,$(ONLY)),--render,$(if $(ONLY),--only $(ONLY))) \
		$(if $(COMMIT),--commit $(COMMIT)) $(if $(GPUS),--gpus $(GPUS))

# One intra-op thread and a longer warm-up keep CPU step times steady on a machine other processes share.
demo: $(ENV)
	$(PY) -m profiler_kit benchmark --model tiny --ctx 64,128 --mode forward,train --warmup 5 --steps 10 \
		--cpu-threads 1 --device cpu
	$(PY) -m profiler_kit kernels summarize profiles/examples/small_ctx128_train_bf16.sqlite --top 8
	$(PY) -m profiler_kit memory summarize memory_snapshots/examples/plain_adamw_fused.pickle --top 5

bench: $(ENV)
	$(PY) -m profiler_kit benchmark --model $(MODEL) --ctx $(CTX) --mode $(MODE) $(MIXED_FLAG)

# The table of docs/scale.md: summaries of a 1M- and a 10M-kernel export, a 2 GB torch trace and a 1 GB memory
# snapshot against their floors (about 20 minutes on 2 cores; the inputs, ~6 GB, go to SCALE_DIR and stay).
SCALE_DIR ?= /tmp/profiler-kit-scale
bench-scale: $(ENV)
	PYTHONPATH=$(REPO_PATH) $(PY) tools/scale_bench.py --kernels 1M,10M --events 9M --entries 5M --workdir $(SCALE_DIR)

# Remade on every call: --force replaces the earlier recording of the config once the new one is complete.
nsys: $(ENV)
	$(PY) -m profiler_kit nsys --model $(MODEL) --ctx $(CTX) --mode $(MODE) $(MIXED_FLAG) --force $(if $(NSYS),--nsys "$(NSYS)")

memory: $(ENV)
	$(PY) -m profiler_kit memory --model $(MODEL) --ctx $(CTX) --mode $(MODE) $(MIXED_FLAG)

attention: $(ENV)
	$(PY) -m profiler_kit attention bench --impl naive,compiled,flash-triton --batch 8 --d 16,32,64,128 \
		--seq 256,1024,4096,8192,16384 --dtype fp32,bf16 $(if $(OUTPUT),--output $(OUTPUT) --resume)

leaderboard: $(ENV)
	$(PY) -m profiler_kit attention leaderboard

# Mutation testing with mutmut, outside `make test`: each room (recording, kernels, memory; ROOM picks one) against
# its own tests, in a copy under MUTANTS_DIR (kept, so that a run resumes); MODULE and TESTS narrow a run.
# Hours for all three rooms on 2 cores; README's Development section says how to read the result.
MUTANTS_DIR ?= /tmp/profiler-kit-mutants
mutants: $(ENV)
	$(PY) -m pip install -q -e '.[dev,mutants]'
	$(PY) tools/mutants.py --workdir $(MUTANTS_DIR) $(if $(ROOM),--room $(ROOM)) $(foreach m,$(MODULE),--module $(m)) \
		$(foreach t,$(TESTS),--tests $(t))

lint: $(ENV)
	$(PY) -m ruff check profiler_kit tests

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
