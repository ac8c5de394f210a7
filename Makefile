# Two commands for a fresh machine: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONSTRAINTS := requirements/constraints-cpu.txt
STAMP := $(VENV)/.installed

.PHONY: demo test lint docs bench gpu-check bytecode clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pip compiles each installed module to bytecode one at a time (55 of its 105 s here); compiled on every core afterwards
# instead (22 s), skipping what does not compile, as pip does (torch ships a file in Python 3.12's syntax)
$(STAMP): $(BIN)/python pyproject.toml $(CONSTRAINTS)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-compile -c $(CONSTRAINTS) -e '.[dev,docs,wandb-report]' \
		> $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; echo "pip install failed (log: $(VENV)/pip.log)"; exit 1; }
	$(BIN)/python -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=0)"
	$(BIN)/python -c "import lightning_scale, torch, lightning, torchdata, s3fs, moto" 
	touch $(STAMP)

# Bytecode for our own sources: with PYTHONDONTWRITEBYTECODE set (as on these machines) every process of the demo and
# the tests would otherwise compile them again at start-up.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q lightning_scale examples tests benchmarks > /dev/null

demo: bytecode
	$(BIN)/python examples/demo.py

RUFF := $(BIN)/ruff check lightning_scale tests examples benchmarks && $(BIN)/ruff format --check lightning_scale tests examples benchmarks

lint: $(STAMP)
	$(RUFF)
	$(BIN)/mypy

# ruff, then three workers on CI's two cores (their tests wait often), whole files each, the longest first (see
# docs/development.md); mypy is one of the tests
test: bytecode
	$(RUFF)
	$(BIN)/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder

# The documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or a missing API name fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

# What one lent GPU can show (skipped, with the reason, without CUDA): a memory snapshot/restore cycle on CUDA, with
# dropout under deterministic algorithms, checked bitwise; each strategy at world size 1 on NCCL, an async save's
# device-to-host staging and the CUDA allocator's peaks.
gpu-check: $(STAMP)
	$(BIN)/python -m benchmarks.gpu_snapshot
	$(BIN)/python -m benchmarks.gpu_strategies

clean:
	rm -rf $(VENV) runs site
