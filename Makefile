# `make lab`: set up everything on a fresh machine, then start JupyterLab on notebooks/.
# `make test`: the same set-up, then the tests (about ten minutes on two cores): each notebook's .py and .ipynb in
# sync, pytest, nbval; `make test-slow`: the checks too slow for that (marked `slow`); `make test-kernels`: every
# notebook under other CPU kernels against the same stored outputs; CI runs all three.
# Both install the exact versions in requirements.lock; `make lock` moves them to today's newest releases,
# and `make test-latest` runs every test on the newest releases pyproject.toml allows, in .venv-latest.
# A second run skips what is already installed.
PYTHON ?= python3
# torch's and oneDNN's CPU kernels at AVX2 width on every machine, so that the same seed gives the same
# numbers (grpo_debug/kernels.py says why)
export ATEN_CPU_CAPABILITY ?= avx2
export ONEDNN_MAX_CPU_ISA ?= AVX2
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK := requirements.lock
# what the environment is installed from: `lock` (exact versions, hashes checked) or `latest` (the newest
# releases pyproject.toml's ranges allow)
RESOLVE ?= lock
# where the CPU build of torch 2.13.0 lies, so that `make lock` resolves torch's own dependencies from that
# build (PyPI's torch pulls in CUDA packages); torch itself is installed by its own line below, not the lock
TORCH_WHEELS ?= /opt/wheels
UV_VERSION := 0.13.9
NOTEBOOKS := $(wildcard notebooks/*.ipynb)
LAB_PORT ?= 8888
LAB_ARGS ?=
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: lab test test-slow test-kernels test-latest lock notebooks exercises docs setup stockfish chromium data model evaluate

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch from its own line, then the lock by uv (its own entry in the lock first, by pip, hashes checked): every
# package at its locked version with its hashes checked, in seconds; the time it took is printed. Compiled to
# bytecode at install: where PYTHONDONTWRITEBYTECODE is set (this CI's machines) no process would cache it, and each
# would compile transformers, peft and trl anew on import (seconds per command, per notebook, per test).
$(STAMP): $(BIN)/python pyproject.toml $(LOCK)
	@date +%s > $(VENV)/.install-start
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
ifeq ($(RESOLVE),latest)
	$(BIN)/pip install --disable-pip-version-check --upgrade --upgrade-strategy eager -e ".[test,trackers,docs]"
else
	sed -n '/^uv==/,/# via/p' $(LOCK) > $(VENV)/uv-requirement.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --require-hashes -r $(VENV)/uv-requirement.txt
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps --compile-bytecode --require-hashes -r $(LOCK)
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
endif
	@echo "set-up: the environment installed in $$(( $$(date +%s) - $$(cat $(VENV)/.install-start) )) s"
	touch $(STAMP)

# Move the lock to the newest releases pyproject.toml allows (every platform, Python 3.11 up: TRL 1.16 needs 3.11), then
# `make test-latest` or `make test` to see it green before committing requirements.lock.
lock: $(BIN)/python
	$(BIN)/pip install --disable-pip-version-check -q uv==$(UV_VERSION)
	echo "torch==2.13.0" > $(VENV)/torch-constraint.txt
	$(BIN)/uv pip compile pyproject.toml --extra test --extra trackers --extra docs --universal --python-version 3.11 --upgrade \
	  $(if $(wildcard $(TORCH_WHEELS)),--find-links $(TORCH_WHEELS)) -c $(VENV)/torch-constraint.txt \
	  --overrides lock-overrides.txt --no-emit-package torch --generate-hashes --custom-compile-command "make lock" -o $(LOCK)

# Every test on the newest releases (a separate environment, so the locked one stays as it is).
test-latest:
	$(MAKE) test test-slow VENV=.venv-latest RESOLVE=latest

# $(call apt_install,PRESENT,PACKAGE,NAME,HINT): nothing if the shell test PRESENT passes; as root with apt-get,
# install Debian's PACKAGE; otherwise run HINT (echo lines saying how to install NAME) and fail.
define apt_install
@if $(1); then \
  :; \
elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
  echo "installing $(3) from Debian's $(2) package"; \
  start=$$(date +%s); \
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) && \
  echo "set-up: $(3) installed in $$(( $$(date +%s) - start )) s"; \
else \
  $(4) \
  exit 1; \
fi
endef

STOCKFISH_PRESENT = command -v stockfish >/dev/null 2>&1 || [ -x /usr/games/stockfish ] || [ -n "$$STOCKFISH_PATH" ]
STOCKFISH_HINT = echo "Stockfish is missing. Install it with 'sudo apt-get install stockfish' (Debian/Ubuntu),"; \
  echo "'conda install -c conda-forge stockfish', or set STOCKFISH_PATH to the binary.";

stockfish:
	$(call apt_install,$(STOCKFISH_PRESENT),stockfish,Stockfish,$(STOCKFISH_HINT))

# Headless browser for tests/test_browser.py (driven by the Python playwright package, which is
# pointed at /usr/bin/chromium; `playwright install` is never used).
CHROMIUM_HINT = echo "Chromium is missing (tests/test_browser.py needs /usr/bin/chromium)."; \
  echo "Install it with 'sudo apt-get install chromium' (Debian) or run 'make setup' as root.";

chromium:
	$(call apt_install,[ -x /usr/bin/chromium ],chromium,Chromium,$(CHROMIUM_HINT))

setup: $(STAMP) stockfish chromium

lab: setup
	$(BIN)/jupyter lab --notebook-dir=notebooks --port=$(LAB_PORT) $(ROOT_FLAG) $(LAB_ARGS)

# Notebooks: edit notebooks/NN_name.py (jupytext percent source); `make notebooks` syncs each .ipynb
# and executes it in place, so the stored outputs that nbval compares are today's, then tidies it (no execution
# timestamps, widgets numbered in order), so that an unchanged notebook leaves `git status` clean.
notebooks: setup
	for nb in $(NOTEBOOKS); do \
	  $(BIN)/jupytext -q --sync "$${nb%.ipynb}.py" && \
	  $(BIN)/jupyter nbconvert --log-level=WARN --to notebook --execute --inplace "$$nb" && \
	  $(BIN)/python tests/notebook_pairs.py --tidy "$$nb" && \
	  $(BIN)/jupytext -q --sync "$$nb" || exit 1; \
	done

# The documentation as a site (MkDocs, from docs/ and mkdocs.yml) in site/, every warning an error: a page not in
# the navigation, a link to a page or an anchor that is not there.
docs: setup
	$(BIN)/mkdocs build --strict --site-dir site

# The student's copies of the notebooks with exercises: every cell tagged "solution" emptied (its functions' bodies
# raise NotImplementedError), every output cleared, in exercises/ (`grpo_debug.exercises.student_copy`).
EXERCISE_NOTEBOOKS := notebooks/04_advantages.ipynb notebooks/05_loss.ipynb notebooks/06_update.ipynb
exercises: setup
	$(BIN)/python -m grpo_debug.exercises exercises $(EXERCISE_NOTEBOOKS)

# pytest and nbval on every core, the 30 slowest tests and set-ups printed at the end; `make test` takes what is
# not marked `slow` (tests/conftest.py marks the slow notebooks), `make test-slow` the rest.
PYTEST = $(BIN)/python -m pytest -n auto --dist loadscope --durations=30 tests \
  $(if $(NOTEBOOKS),--nbval $(NOTEBOOKS) --nbval-sanitize-with notebooks/sanitize.cfg --nbval-cell-timeout=600)

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tests/notebook_pairs.py
	$(PYTEST) -m "not slow"

test-slow: setup
	$(PYTEST) -m slow

# Every notebook again under other CPU kernels, against the same stored outputs: MKL's compatible path (what an AMD
# CPU and an Intel one compute alike) and 2 torch threads (float sums split in two), both in one pass. A stored output
# that holds digits one machine's kernels decided fails here, on the developers' machine, before it fails on a
# user's. tests/test_digits.py (the digits and the sanitizer) brings tests/conftest.py's tiers.
# One notebook at a time: two workers of two threads on two cores made each one's OpenMP threads wait on the other's
# (10_doctor's diagnosis: 34 s alone, 300 s beside another, on this machine).
NBVAL = $(BIN)/python -m pytest --dist loadscope -p no:cacheprovider --nbval $(NOTEBOOKS) \
  --nbval-sanitize-with notebooks/sanitize.cfg --nbval-cell-timeout=600
test-kernels: setup
	MKL_CBWR=COMPATIBLE GRPO_DEBUG_THREADS=2 $(NBVAL) -n 1 --durations=10 tests/test_digits.py

data: setup
	$(BIN)/python -m grpo_debug.chess.data build

model: setup
	$(BIN)/python -m grpo_debug.chess.train_model

evaluate: setup
	$(BIN)/python -m grpo_debug.chess.quality
