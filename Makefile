# The two commands of the README. Each one creates .venv and installs what it needs.
PY := .venv/bin/python
STAMP := .venv/.installed

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark,bench]'
	touch $(STAMP)

.PHONY: demo test bench
demo: $(STAMP)
	$(PY) -m bucketspark.demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m benchmarks.run_all
