# Two entry points that work on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# the tests: a worker per core (pytest-xdist, at most 4), a file at a time; `make test WORKERS=` runs one process
WORKERS ?= -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder

.PHONY: demo test test-slow install runner runner-arm64 clean lint

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
	$(BIN)/python -m pytest -q $(WORKERS)

test-slow: $(STAMP) runner
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) build *.egg-info

# the linter (ruff, configured in pyproject.toml); CI runs it before the tests
lint: $(STAMP)
	$(BIN)/ruff check .

# hyflash-run for ARM64 Linux, cross-built against the aarch64 ExecuTorch wheel of the installed version
# (unpacked, not installed), for the armv8-a baseline (an armv8.2-a+dotprod build gives the same kernel object:
# they are fp32; the wheel's XNNPACK picks its int8 kernels by the CPU at run time); run under qemu-user
# (`make test-slow`: tests/test_runner_arm64.py). Installs Debian's cross compiler and qemu-user if missing.
ARM64   := build/arm64
ARM_ET   = $(ARM64)/site/executorch
runner-arm64: $(STAMP)
	@command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null || \
	  { apt-get update -q >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -q g++-aarch64-linux-gnu qemu-user >/dev/null; }
	@test -f $(ARM_ET)/version.py || { \
	  v=$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("executorch"))'); \
	  py=$$($(BIN)/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")'); \
	  $(BIN)/pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 --python-version $$py \
	    executorch==$$v -d $(ARM64)/wheel && rm -rf $(ARM64)/site && mkdir -p $(ARM64)/site && \
	  unzip -q -o $(ARM64)/wheel/executorch-$$v-*aarch64.whl 'executorch/include/*' 'executorch/lib/*' 'executorch/version.py' -d $(ARM64)/site; }
	@for arch in armv8-a; do \
	  cmake -S runtime_cpp -B $(ARM64)/$$arch -DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/runtime_cpp/cmake/aarch64-linux-gnu.cmake \
	    -DEXECUTORCH_ROOT=$(CURDIR)/$(ARM_ET) -DHYFLASH_ARCH=$$arch > /dev/null && \
	  cmake --build $(ARM64)/$$arch -j2 > /dev/null || exit 1; \
	  file $(ARM64)/$$arch/hyflash-run; done
