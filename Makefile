# trustfl — `make run` and `make test` are all a newcomer needs (both create .venv on first use).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: setup run test bench data clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,flower]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/trustfl run configs/quickstart.toml

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: setup
	$(BIN)/python benchmarks/engine_throughput.py
	$(BIN)/python benchmarks/startup.py

data: setup
	$(BIN)/python scripts/fetch_data.py

clean:
	rm -rf $(VENV) runs .pytest_cache
