# Lyceum: `make run` serves the app, `make test` runs the whole suite.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
# `make run` is for development: it asks for DEBUG (off unless asked for).
DEBUG ?= 1
PG_TEST_URL ?= postgres://postgres@127.0.0.1:5432/lyceum

.PHONY: run test test-fast lint typecheck format chromium gettext messages i18n-check bench clean

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

# GNU gettext (msgfmt, xgettext): `make messages` and the translation check need it.
gettext:
	@if [ ! -x /usr/bin/msgfmt ] || [ ! -x /usr/bin/xgettext ]; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gettext >/dev/null; \
	  else echo "GNU gettext is missing: run 'sudo apt-get install -y gettext'"; exit 1; fi; \
	fi

# Translations: extract every string of the interface into locale/zh_Hans/.../django.po
# (new ones come with an empty msgstr to translate), then compile the .mo files committed
# beside them (so `make run` needs no gettext).
MESSAGES_IGNORE := --ignore='tests/*' --ignore='bench/*' --ignore='staticfiles/*' \
	--ignore='media/*' --ignore='workspaces/*' --ignore='*/migrations/*' --ignore='*/management/*'
messages: $(VENV)/.installed gettext
	DEBUG=1 $(PY) manage.py makemessages -l zh_Hans --no-obsolete --add-location=file $(MESSAGES_IGNORE)
	DEBUG=1 $(PY) manage.py compilemessages -l zh_Hans --ignore='.venv' --ignore='staticfiles'

# Fails, listing file:line and text, when a string of the interface has no Chinese
# translation or a .mo is older than its .po.
i18n-check: $(VENV)/.installed gettext
	$(PY) -m chatsite.i18n_check

test: $(VENV)/.installed-dev chromium gettext
	$(VENV)/bin/ruff check .
	$(MAKE) --no-print-directory i18n-check
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
