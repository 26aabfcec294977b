# Every target creates the virtualenv when it is missing, so a fresh clone needs
# only `make demo` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test install clean

# --compile-bytecode: the .pyc files now, once. Where PYTHONDONTWRITEBYTECODE is set (this
# machine's image sets it) Python never writes them, and every process (each test worker,
# each CLI run of the tests) compiled boto3, moto and langgraph from source: 2.7 s -> 1.3 s.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

# `make docs`: the documentation site (mkdocs.yml, docs/) into site/. --strict: a broken
# link, a missing anchor or an API name mkdocstrings cannot resolve fails the build.
.PHONY: docs

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# `make test`: the suite a newcomer runs first (about 10 minutes on 2 cores, install included). Every public
# operation in both index modes; the tests marked slow (every other combination of the test
# parameters, the rest of the drills' variants, cost invariants over large stores, the infra
# linters) wait for `make test-slow`.
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# `make test-slow`: only the tests marked slow. CI (.ci/run) runs it after `make test`,
# so nothing the suite holds goes unrun on a submission.
.PHONY: test-slow

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m 'slow and not faults' $(PYTEST_ARGS)

# `make test-all`: both, with the long forms of the sampled tests (every cut of the
# cut-short tests, the whole SeaweedFS graph matrix, longer simulation budgets).
.PHONY: test-all

test-all: $(STAMP)
	TEST_ALL=1 $(BIN)/python -m pytest -m 'not faults' $(PYTEST_ARGS)

# `make soak SOAK_MINUTES=30`: the deterministic simulations (tests/test_simulation.py, the
# store's tests/test_store_simulation.py) and the stateful property test (tests/test_stateful.py)
# with a large budget, the minutes split across their twenty tests (-n 2, two workers: each gets SOAK_MINUTES/10),
# then the longer fault-injection variants of tests/test_faults.py (-m faults), then
# the cut-short tests cutting after every round trip (make test samples the cuts) and
# the outage drill in every mode, outage kind and stale queue (tests/test_outage.py).
# SIM_SEED=N fixes the base seed; a failure prints the command that replays it.
SOAK_MINUTES ?= 10

.PHONY: soak

soak: $(STAMP)
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_SHARES=10 SIM_KEEP_GOING=1 $(BIN)/python -m pytest -p no:cacheprovider -s -n 2 -m 'not faults' \
		tests/test_simulation.py tests/test_store_simulation.py tests/test_stateful.py -k 'not replay' $(PYTEST_ARGS)
	$(BIN)/python -m pytest -p no:cacheprovider -m faults tests/test_faults.py $(PYTEST_ARGS)
	TEST_ALL=1 $(BIN)/python -m pytest -p no:cacheprovider -m 'not faults' tests/test_archive_cut.py tests/test_soundness_switches.py \
		tests/test_outage.py $(PYTEST_ARGS)

# `make bench` (benchmarks/): the published peers (benchmarks/peers.py) live in two
# virtualenvs of their own, with the same langgraph versions as $(VENV):
# langgraph-checkpoint-aws needs a newer boto3 than aioboto3's pins allow, so it and
# langgraph-checkpoint-dynamodb (plain boto3) are in PEER_VENV, the aioboto3/aiobotocore
# ones in PEER_AIO_VENV (langgraph-checkpoint-amazon-dynamodb imports under the same
# module name as langgraph-checkpoint-dynamodb: they cannot share a venv either).
# The stamps name the versions, so bumping a pin reinstalls.
# BENCH_ARGS passes options, e.g. BENCH_ARGS="--turns 50".
PEER_VENV := benchmarks/.venv-peer
PEER_PKG := langgraph-checkpoint-aws==1.2.6 langgraph-checkpoint-dynamodb==0.1.0
PEER_STAMP := $(PEER_VENV)/.installed-$(subst ==,-,$(subst $() ,_,$(PEER_PKG)))
PEER_AIO_VENV := benchmarks/.venv-peer-aio
PEER_AIO_PKG := langgraph-checkpoint-s3==0.1.3 langgraph-checkpoint-amazon-dynamodb==0.1.3 \
	langgraph-checkpoint-objectstorage[s3]==0.1.15
PEER_AIO_STAMP := $(PEER_AIO_VENV)/.installed-$(subst [,-,$(subst ],,$(subst ==,-,$(subst $() ,_,$(strip $(PEER_AIO_PKG))))))

.PHONY: bench

$(PEER_STAMP): $(STAMP)
	$(BIN)/uv venv -q --allow-existing --python $(PYTHON) $(PEER_VENV)
	$(BIN)/uv pip install -q --python $(PEER_VENV)/bin/python $(PEER_PKG) $$($(BIN)/python -m benchmarks.pins)
	touch $(PEER_STAMP)

$(PEER_AIO_STAMP): $(STAMP)
	$(BIN)/uv venv -q --allow-existing --python $(PYTHON) $(PEER_AIO_VENV)
	$(BIN)/uv pip install -q --python $(PEER_AIO_VENV)/bin/python $(foreach p,$(PEER_AIO_PKG),'$(p)') \
		$$($(BIN)/python -m benchmarks.pins)
	touch '$(PEER_AIO_STAMP)'

bench: $(STAMP) $(PEER_STAMP) $(PEER_AIO_STAMP)
	$(BIN)/python -m benchmarks $(BENCH_ARGS)
	$(BIN)/python -m benchmarks.encryption $(BENCH_ENCRYPTION_ARGS)
	$(BIN)/python -m benchmarks.memory_store $(BENCH_MEMORY_ARGS)

# `make bench-encryption`: S3Saver with and without encryption= (LocalKey, KmsKey on moto),
# both index modes (benchmarks/encryption.py, about a minute): requests and round trips per
# call, a cold process's extra ones, CPU per MiB, $ with KMS requests. Part of `make bench`.
.PHONY: bench-encryption
bench-encryption: $(STAMP)
	$(BIN)/python -m benchmarks.encryption $(BENCH_ENCRYPTION_ARGS)

# `make bench-memory`: the long-term memory workload alone (benchmarks/memory_store.py):
# S3Store in both index modes beside langgraph-checkpoint-aws's DynamoDBStore (PEER_VENV),
# and one namespace grown to 5,000 items. Part of `make bench`; options through
# BENCH_MEMORY_ARGS, e.g. BENCH_MEMORY_ARGS="--variants plain --head-sizes ''".
.PHONY: bench-memory

bench-memory: $(STAMP) $(PEER_STAMP)
	$(BIN)/python -m benchmarks.memory_store $(BENCH_MEMORY_ARGS)

# infra/ lint tools live in their own virtualenv: checkov pins an older boto3 than
# aioboto3 accepts. The stamp names the versions, so bumping a pin reinstalls.
INFRA_VENV := .venv-infra
INFRA_TOOLS := cfn-lint==1.58.0 checkov==3.3.30
INFRA_STAMP := $(INFRA_VENV)/.installed-$(subst ==,-,$(subst $() ,_,$(INFRA_TOOLS)))

.PHONY: infra-tools

$(INFRA_STAMP): | $(STAMP)
	$(BIN)/uv venv -q --allow-existing --python $(PYTHON) $(INFRA_VENV)
	$(BIN)/uv pip install -q --python $(INFRA_VENV)/bin/python $(INFRA_TOOLS)
	touch $(INFRA_STAMP)

infra-tools: $(INFRA_STAMP)

# Here, below INFRA_STAMP's definition: make expands a rule's prerequisites as it reads it.
test-slow test-all: $(INFRA_STAMP)

clean:
	rm -rf $(VENV)
	rm -rf $(INFRA_VENV)
