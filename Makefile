# agentrun: `make up` runs everything locally, `make test` runs the whole test suite.
# Both create .venv with the Python found as $(PYTHON) (3.11+) and install pyproject's
# pinned dependencies into it; that step is skipped while pyproject.toml is unchanged.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
HOST   ?= 127.0.0.1
PORT   ?= 8000
WORKERS ?= 1
CHROMIUM := /usr/bin/chromium
# The tests get their own database and broker folder, never the dev ones under var/.
TEST_VAR := $(CURDIR)/var/test

.PHONY: up test install lint chromium clean

install: $(STAMP)

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "agentrun needs Python 3.11+; $(PYTHON) is $$($(PYTHON) -V 2>&1). Try: make PYTHON=python3.11 ..."; exit 1; }
	$(PYTHON) -m venv $(VENV)

# Dependencies only (runtime + [dev]), read from pyproject.toml: the project itself runs
# from this directory, so it needs no build and leaves no egg-info behind.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))' > $(VENV)/requirements.txt
	$(BIN)/python -m pip install --disable-pip-version-check -r $(VENV)/requirements.txt
	@touch $@

up: $(STAMP)
	exec $(BIN)/python manage.py up --host $(HOST) --port $(PORT) --workers $(WORKERS)

# Debian's chromium for the Playwright browser tests: installed when missing and we can
# (root with apt-get). Otherwise the browser tests are skipped, or fail when CI=true.
chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium for the browser tests (apt-get)"; \
	    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } \
	      || echo "warning: could not install chromium; browser tests will be skipped"; \
	  else \
	    echo "warning: $(CHROMIUM) is missing (install Debian's chromium); browser tests will be skipped"; \
	  fi; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) chromium
	$(BIN)/ruff check .
	AGENTRUN_VAR_DIR=$(TEST_VAR) $(BIN)/python manage.py makemigrations --check --dry-run
	AGENTRUN_VAR_DIR=$(TEST_VAR) $(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(TEST_VAR)
