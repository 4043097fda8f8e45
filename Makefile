# The two commands of the README: `make reproduce` (full reproduction) and `make test`.
# Both create .venv when missing and install torch==2.13.0 first (the CPU build on this
# machine; any other torch pulls a multi-GB CUDA build), then the exact versions of
# requirements.lock (--no-deps: the lock is the whole set), then the package itself.
# `make lock` refreshes the lock (after a change to pyproject's dependencies).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.nslib-installed
TORCH := torch==2.13.0
LOCK := requirements.lock
LOCK_VENV := .lock-venv

.PHONY: setup test test-fast reproduce reproduce-quick data clean-cache lock

setup: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet --no-deps -r $(LOCK)
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

# The newest versions pyproject allows, resolved in a throw-away venv (torch first) and frozen:
# nslib itself, pip and wheel, nvidia-* (xgboost's optional GPU library) and local version
# labels (+cpu) left out. tests/test_setup.py checks the lock against pyproject.
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet $(TORCH)
	$(LOCK_VENV)/bin/pip install --quiet -e '.[dev]'
	{ echo "# Exact versions of every dependency (pyproject's, dev extras included, and theirs)."; \
	  echo "# Installed by make setup after $(TORCH), with --no-deps; refresh with make lock."; \
	  echo "# Packages named nvidia-* are left out on purpose (the CPU build needs none)."; \
	  $(LOCK_VENV)/bin/pip freeze --all --exclude-editable \
	    | grep -v -E '^(nvidia-|pip==|wheel==|nslib==)' | sed -E 's/\+[A-Za-z0-9.]+$$//'; \
	} > $(LOCK).tmp && mv $(LOCK).tmp $(LOCK)
	rm -rf $(LOCK_VENV)

# Find the data (NSLIB_DATA, or datasets/neusight; NSLIB_MIXED, or datasets/mixed;
# NSLIB_KERNELBENCH, or datasets/kernelbench), fetching the pinned copies when absent.
data: setup
	@$(BIN)/python -c "from nslib.data.paths import data_root; data_root()" 2>/dev/null \
		|| $(BIN)/nslib fetch
	@$(BIN)/python -c "from nslib.data.paths import mixed_root; mixed_root()" 2>/dev/null \
		|| $(BIN)/nslib fetch --mixed
	@$(BIN)/python -c "from nslib.data.kernelbench import kernelbench_root; kernelbench_root()" \
		2>/dev/null || $(BIN)/nslib fetch --kernelbench

test: setup
	MPLBACKEND=Agg $(BIN)/pytest -q --durations=15

# everything but the tests marked slow (executed notebooks, whole-table properties)
test-fast: setup
	MPLBACKEND=Agg $(BIN)/pytest -q -m "not slow"

# no MPLBACKEND=Agg here: the executed notebooks in results/ keep their figures inline
reproduce: data
	$(BIN)/nslib reproduce

reproduce-quick: data
	$(BIN)/nslib reproduce --quick

clean-cache:
	rm -rf $${NSLIB_CACHE:-$$HOME/.cache/nslib}
