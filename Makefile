# The two commands of the README: `make reproduce` (full reproduction) and `make test`.
# Both create .venv when missing and install torch==2.13.0 first (the CPU build on this
# machine; any other torch pulls a multi-GB CUDA build), then the package with its dev extras.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.nslib-installed

.PHONY: setup test test-all reproduce reproduce-quick data clean-cache

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Find the data (NSLIB_DATA, or datasets/neusight), fetching the pinned copy when absent.
data: setup
	@$(BIN)/python -c "from nslib.paths import data_root; data_root()" 2>/dev/null \
		|| $(BIN)/nslib fetch

test: setup
	MPLBACKEND=Agg $(BIN)/pytest -q

reproduce: data
	MPLBACKEND=Agg $(BIN)/nslib reproduce

reproduce-quick: data
	MPLBACKEND=Agg $(BIN)/nslib reproduce --quick

clean-cache:
	rm -rf $${NSLIB_CACHE:-$$HOME/.cache/nslib}
