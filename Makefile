# The README's two commands: `make demo` and `make test`. Both set up .venv on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

# torch and torchvision must come as a matched, pinned pair; an unmatched pair fails to import.
ifeq ($(shell uname -m),aarch64)
TORCH_PAIR := torch==2.9.1 torchvision==0.24.1
else
TORCH_PAIR := torch==2.14.1 torchvision==0.29.1
endif

# make demo: none, cs and ls from one seed, 1,950 steps each, scored on 1,000 samples every 650
# steps (so "steps to none's final FD" resolves a 1.5x speed-up), one run after another.
DEMO_ARGS := --methods none,cs,ls --steps 1950 eval.every=650 eval.num_samples=1000 eval.steps=10 \
	train.checkpoint_every=650 diagnostics.every=50

.PHONY: setup demo test bench lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch, torchvision" 2>/dev/null || $(BIN)/python -m pip install $(TORCH_PAIR)
	$(BIN)/python -m pip install -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	@start=$$(date +%s); \
	$(BIN)/scalelong compare demo $(DEMO_ARGS); status=$$?; \
	echo "make demo: $$(( $$(date +%s) - start )) s elapsed"; exit $$status

test: setup
	$(BIN)/python -m pytest -n auto  # one worker per core; each test runs single-threaded

bench: setup
	$(BIN)/python -m benchmarks

lint: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

clean:
	rm -rf $(VENV) runs
