# Every target creates the virtualenv when it is missing, so a fresh clone needs
# only `make demo` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

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

test: $(INFRA_STAMP)

clean:
	rm -rf $(VENV)
	rm -rf $(INFRA_VENV)
