# Lyceum: `make run` serves the app, `make test` runs the whole suite.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
# `make run` is for development: it asks for DEBUG (off unless asked for).
DEBUG ?= 1
PG_TEST_URL ?= postgres://postgres@127.0.0.1:5432/lyceum

.PHONY: run test test-fast lint typecheck format chromium bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

run: export DEBUG := $(DEBUG)
run: $(VENV)/.installed
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput --verbosity 0
	$(PY) manage.py setup_demo
	$(PY) manage.py recover_runs --all
	$(PY) -m daphne -b 127.0.0.1 -p $(PORT) chatsite.asgi:application

chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "Chromium is missing: run 'sudo apt-get install -y chromium'"; exit 1; fi; \
	fi

test: $(VENV)/.installed-dev chromium
	$(VENV)/bin/ruff check .
	$(MAKE) --no-print-directory typecheck
	$(VENV)/bin/pytest -q
	# Persistent connections would keep the test database busy at teardown.
	DATABASE_URL=$(PG_TEST_URL) LYCEUM_CONN_MAX_AGE=0 $(VENV)/bin/pytest -q -m persistence

test-fast: $(VENV)/.installed-dev
	$(VENV)/bin/pytest -q -m "not browser"

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Strict on chat.core, chat.llm and chat.agent; the rest non-strict (pyproject.toml).
typecheck: $(VENV)/.installed-dev
	$(VENV)/bin/mypy

format: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: $(VENV)/.installed-dev
	$(PY) bench/bench_select.py
	$(PY) bench/bench_provider.py
	$(PY) bench/bench_loop.py
	$(PY) bench/bench_longchat.py
	$(PY) bench/bench_streams.py

clean:
	rm -rf $(VENV) .mypy_cache staticfiles db.sqlite3* test_db*.sqlite3*
