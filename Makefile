# agentrun: `make up` runs everything locally, `make test` runs the whole test suite,
# `make docs` builds the documentation site into site/.
# Each creates .venv with the Python found as $(PYTHON) (3.11+) and installs pyproject's
# pinned dependencies into it: `make up` the runtime ones, `make test` and `make docs`
# those and [dev].
# Each install is skipped while pyproject.toml is unchanged.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Stamps: the runtime dependencies are installed, and the [dev] ones on top of them.
STAMP  := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
HOST   ?= 127.0.0.1
PORT   ?= 8000
WORKERS ?= 1
CHROMIUM := /usr/bin/chromium
# The tests get their own database and broker folder, never the dev ones under var/.
TEST_VAR := $(CURDIR)/var/test

.PHONY: up test docs install install-dev lint chromium phoenix clean

install: $(STAMP)
install-dev: $(DEV_STAMP)

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "agentrun needs Python 3.11+; $(PYTHON) is $$($(PYTHON) -V 2>&1). Try: make PYTHON=python3.11 ..."; exit 1; }
	$(PYTHON) -m venv $(VENV)

# Dependencies only, read from pyproject.toml: the project itself runs from this
# directory, so it needs no build and leaves no egg-info behind. [dev] is installed with
# the runtime pins, so pip resolves them together; a new pyproject.toml redoes both.
REQUIREMENTS = $(BIN)/python -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  print("\n".join(p["dependencies"] + [d for x in sys.argv[1:] for d in p["optional-dependencies"][x]]))'

$(STAMP): pyproject.toml | $(BIN)/python
	$(REQUIREMENTS) > $(VENV)/requirements.txt
	$(BIN)/python -m pip install --disable-pip-version-check -r $(VENV)/requirements.txt
	@touch $@

$(DEV_STAMP): $(STAMP)
	$(REQUIREMENTS) dev > $(VENV)/requirements-dev.txt
	$(BIN)/python -m pip install --disable-pip-version-check -r $(VENV)/requirements-dev.txt
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

# Arize Phoenix, the OTLP receiver the trace integration test reads back from
# (tests/telemetry/test_phoenix.py), in a virtualenv of its own: its dependencies are not
# agentrun's, and must not move agentrun's pins. CI installs it (about 1.5 min, 850 MB);
# without it that test is skipped (and fails with CI=true).
PHOENIX_VENV ?= .venv-phoenix
PHOENIX_PIN  := arize-phoenix==20.26.1

phoenix: $(PHOENIX_VENV)/.installed

$(PHOENIX_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/python -m pip install --disable-pip-version-check -q '$(PHOENIX_PIN)'
	@touch $@

lint: $(DEV_STAMP)
	$(BIN)/ruff check .

# The documentation site, from docs/ into site/ (mkdocs.yml); any warning fails the build.
# (NO_MKDOCS_2_WARNING: the theme's notice about its successor, printed at every build.)
docs: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test: $(DEV_STAMP) chromium
	$(BIN)/ruff check .
	AGENTRUN_VAR_DIR=$(TEST_VAR) $(BIN)/python manage.py makemigrations --check --dry-run
	AGENTRUN_VAR_DIR=$(TEST_VAR) $(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(PHOENIX_VENV) $(TEST_VAR)
