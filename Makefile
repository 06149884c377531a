# The two commands of the README. Each one creates .venv and installs what it needs (the [dev]
# extra pulls in [sim] and [spark]).
PY := .venv/bin/python
STAMP := .venv/.installed

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $(STAMP)

# The Node.js driver and mongosh for the tests marked `node`, from the npm registry.
NODE_DEPS := .node/node_modules/mongodb/package.json
$(NODE_DEPS):
	@if command -v npm >/dev/null; then \
		mkdir -p .node && npm install --prefix .node --no-audit --no-fund --loglevel=error mongodb@6 mongosh@2; \
	else echo "npm not found: the Node.js driver and mongosh tests will be skipped"; fi

# The drivers' spec tests live beside the repository, not in it
# (tests/integration/test_spec_change_streams.py).
SPEC_TESTS := $(wildcard $(abspath ../shared/spec-tests))

.PHONY: demo test test-fast bench
demo: $(STAMP)
	$(PY) -m demo

test: $(STAMP) $(NODE_DEPS)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(if $(SPEC_TESTS),PCS_SPEC_TESTS="$${PCS_SPEC_TESTS:-$(SPEC_TESTS)}") $(PY) -m pytest -q

# The unit and component layers alone (docs/testing.md): no sockets, no cluster, no Spark; under a
# minute. `make test` runs them too, with the integration layer.
test-fast: $(STAMP)
	$(PY) -m pytest -q tests/unit tests/component

bench: $(STAMP)
	$(PY) -m benchmarks.run_all
