# The two commands of the README. Each one creates .venv and installs what it needs.
PY := .venv/bin/python
STAMP := .venv/.installed

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark,bench]'
	touch $(STAMP)

# The Node.js driver and mongosh for the tests marked `node`, from the npm registry.
NODE_DEPS := .node/node_modules/mongodb/package.json
$(NODE_DEPS):
	@if command -v npm >/dev/null; then \
		mkdir -p .node && npm install --prefix .node --no-audit --no-fund --loglevel=error mongodb@6 mongosh@2; \
	else echo "npm not found: the Node.js driver and mongosh tests will be skipped"; fi

.PHONY: demo test bench
demo: $(STAMP)
	$(PY) -m bucketspark.demo

test: $(STAMP) $(NODE_DEPS)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m benchmarks.run_all
