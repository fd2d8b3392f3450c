# Two entry points that work on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test test-slow install runner clean lint

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch is pinned here, in the install step: 2.13.0 is the CPU build this machine carries;
# an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/hyflash demo

# the native runner (runtime_cpp/), built against the ExecuTorch wheel the install step put in the venv
runner: $(STAMP)
	cmake -S runtime_cpp -B build/runtime_cpp -DEXECUTORCH_ROOT="$$($(BIN)/python -c 'import executorch; print(list(executorch.__path__)[0])')" > /dev/null
	cmake --build build/runtime_cpp -j2

test: $(STAMP) runner
	$(BIN)/python -m pytest -q

test-slow: $(STAMP) runner
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) build *.egg-info

# the linter (ruff, configured in pyproject.toml); CI runs it before the tests
lint: $(STAMP)
	$(BIN)/ruff check .
