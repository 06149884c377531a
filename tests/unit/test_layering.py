"""The format package is pure: no trio, no sockets, and it imports no other package of ours."""

import ast
import dataclasses
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
OURS = {"simcluster", "wireproxy", "buckets", "bucketspark"}


def test_mongoformats_imports_nothing_of_ours_and_no_io():
    for path in (ROOT / "mongoformats").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top not in OURS | {"trio", "socket", "asyncio", "ssl"}, (
                    f"{path.name} imports {name}"
                )


def test_importing_mongoformats_does_not_load_trio():
    code = (
        "import sys, mongoformats, mongoformats.wire, mongoformats.change_events; "
        "print('trio' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "False"


# The engine's oplog-to-event transform. simcluster's change streams build their events with
# their own reference (simcluster/reference_events.py), so that a differential test compares two
# implementations instead of one with itself.
ENGINE_TRANSFORM = {
    "mongoformats.change_events",
    "mongoformats.crud_events",
    "mongoformats.ddl_events",
    "mongoformats.event_writer",
    "mongoformats.events",
    "mongoformats.oplog_splice",
    "buckets._columnar.batch_splice",
    "buckets._columnar.batch_layout",
    "buckets._columnar.event_block",
    "buckets._columnar.block_kernels",
    "buckets._columnar.id_keys",
    "buckets._columnar.diff_kernel",
    "buckets._columnar.diff_steps",
    "buckets._columnar.update_descriptions",
    "buckets._columnar.txn_batch",
    "buckets._columnar.txn_read",
    "buckets._columnar.txn_events",
    "mongoformats.txn_splice",
    "mongoformats.update_diff",
    "mongoformats.diff_splice",
}
# Byte-level BSON helpers that oplog_splice also holds and that build no event: a reply's cursor
# document and its parts for the wire, and a document's leading `_id` bytes.
WIRE_HELPERS = {
    ("mongoformats.oplog_splice", "cursor_document"),
    ("mongoformats.oplog_splice", "document_parts"),
    ("mongoformats.oplog_splice", "leading_id"),
}
# The reference and the stream serving it also evaluate no event stage or query with the engine's.
REFERENCE_ALSO = {"mongoformats.change_stages", "mongoformats.mql"}


def _imports(path: pathlib.Path) -> list[tuple[str, str | None]]:
    """(module, name) for each `from module import name`, (module, None) for `import module`."""
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.module, a.name) for a in node.names]
            if node.module == "mongoformats":
                out += [(f"mongoformats.{a.name}", None) for a in node.names]
    return out


def test_simcluster_shares_no_transform_code_with_the_engine():
    for path in (ROOT / "simcluster").glob("*.py"):
        for module, name in _imports(path):
            if module in ENGINE_TRANSFORM:
                assert (module, name) in WIRE_HELPERS, (
                    f"simcluster/{path.name} imports {name} from {module}"
                )


def test_the_reference_transform_evaluates_nothing_with_the_engines_modules():
    for path in (ROOT / "simcluster").glob("reference_*.py"):
        for module, _ in _imports(path):
            assert module not in ENGINE_TRANSFORM | REFERENCE_ALSO, (
                f"simcluster/{path.name} imports {module}"
            )
            assert not module.startswith(("buckets", "wireproxy")), (
                f"simcluster/{path.name} imports {module}"
            )
    assert sorted(p.name for p in (ROOT / "simcluster").glob("reference_*.py")) == [
        "reference_diff.py",
        "reference_events.py",
        "reference_fields.py",
    ]


# -- the speed-code fence --------------------------------------------------------------------------
# numpy, numba, llvmlite, pyarrow and ctypes, and process-wide allocator and collector settings,
# live in one sub-package whose code is tested byte for byte against the plain implementation.
FENCE = ROOT / "buckets" / "_columnar"
SPEED_MODULES = {"numpy", "numba", "llvmlite", "pyarrow", "ctypes"}
# Process-wide tuning: glibc's malloc, Arrow's memory pool, the garbage collector's thresholds.
TUNING_CALLS = {"mallopt", "set_memory_pool", "freeze", "set_threshold", "disable"}
# The Spark source and sink exchange rows with Spark as Arrow record batches (Spark's own
# interface for Python data sources), not as a speed trick.
# simcluster's process keeps its replies' memory in glibc's heap through ctypes
# (simcluster/__main__.py, _keep_large_replies_in_the_heap): it imports nothing of the proxy's.
ALLOWED_OUTSIDE = {("bucketspark", "pyarrow"), ("simcluster", "ctypes")}
# A Spark Python worker is a process of Spark's, which bucketspark's tasks run in without the
# fence's package: its task start freezes what the worker holds (client.settle_worker_heap).
# simcluster is a stand-in server of its own, which imports nothing of the proxy's: its process
# freezes what it holds every second so that no full collection stops the whole cluster
# (simcluster/__main__.py, _freeze_what_lives), and sets glibc's malloc to keep freed replies.
TUNING_ALLOWED = {
    ("bucketspark/client.py", "freeze"),
    ("simcluster/__main__.py", "freeze"),
    ("simcluster/__main__.py", "mallopt"),
}


def _code_outside_the_fence() -> list[pathlib.Path]:
    """Every module of the project's packages and tools, but the fence, tests and benchmarks."""
    return [
        path
        for path in sorted(ROOT.glob("*/**/*.py"))
        if path.relative_to(ROOT).parts[0] not in {"tests", "benchmarks", ".venv"}
        and FENCE not in path.parents
    ]


def test_speed_libraries_and_process_tuning_live_only_in_the_columnar_fence():
    assert (FENCE / "__init__.py").exists()
    found: list[str] = []
    for path in _code_outside_the_fence():
        package = path.relative_to(ROOT).parts[0]
        for node in ast.walk(ast.parse(path.read_text())):  # function-level imports too
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
                if node.module == "gc":  # `from gc import freeze`
                    found += [
                        f"{where} imports gc.{a.name}" for a in node.names if a.name in TUNING_CALLS
                    ]
            elif isinstance(node, ast.Attribute) and node.attr in TUNING_CALLS:
                # `gc.freeze()`, `libc.mallopt(...)`, `pa.set_memory_pool(...)`; not
                # `frozenset.freeze`.
                is_gc = isinstance(node.value, ast.Name) and node.value.id == "gc"
                allowed = (str(path.relative_to(ROOT)), node.attr) in TUNING_ALLOWED
                if (is_gc or node.attr in {"mallopt", "set_memory_pool"}) and not allowed:
                    found.append(f"{where} calls {node.attr}")
            found += [
                f"{where} imports {name}"
                for name in names
                if name.split(".")[0] in SPEED_MODULES
                and (package, name.split(".")[0]) not in ALLOWED_OUTSIDE
            ]
    assert found == []


def test_importing_every_mongoformats_module_loads_no_speed_library_and_no_trio():
    """A fresh interpreter: what `import mongoformats.x` drags in, through any import chain."""
    modules = sorted(
        f"mongoformats.{p.stem}"
        for p in (ROOT / "mongoformats").glob("*.py")
        if p.stem != "__init__"
    )
    assert "mongoformats.wire" in modules and "mongoformats.oplog_splice" in modules
    code = (
        f"import sys\nfor m in {modules!r}:\n    __import__(m)\n"
        "print(sorted(m for m in ('numpy', 'numba', 'llvmlite', 'pyarrow', 'trio')"
        " if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


# What the Spark package may import: it talks to the proxy over the wire only. bson is pymongo's;
# pyarrow and pandas are what pyspark's Arrow path runs on.
SPARK_ALLOWED = {"bucketspark", "mongoformats", "pymongo", "bson", "pyspark", "pyarrow", "pandas"}
PACKAGES = ("mongoformats", "simcluster", "wireproxy", "buckets", "bucketspark")


def test_bucketspark_imports_only_pymongo_pyspark_stdlib_and_mongoformats():
    """Every import statement counts, also those inside functions and under TYPE_CHECKING."""
    for path in (ROOT / "bucketspark").rglob("*.py"):
        for module, _ in _imports(path):
            top = module.split(".")[0]
            allowed = top in SPARK_ALLOWED or top in sys.stdlib_module_names
            assert allowed, f"bucketspark/{path.relative_to(ROOT / 'bucketspark')} imports {module}"


def test_importing_every_bucketspark_module_loads_no_other_package_of_ours():
    modules = sorted(
        f"bucketspark.{p.stem}" for p in (ROOT / "bucketspark").glob("*.py") if p.stem != "__init__"
    )
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'simcluster', 'wireproxy', 'buckets', 'demo'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def _mongoformats_graph() -> dict[str, set[str]]:
    """Which mongoformats modules each one imports, anywhere in it (functions, TYPE_CHECKING)."""
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "mongoformats").glob("*.py"):
        name = f"mongoformats.{path.stem}"
        graph[name] = {
            module
            for module, _ in _imports(path)
            if module.startswith("mongoformats.") and module != name
        }
    return graph


def _assert_acyclic(graph: dict[str, set[str]]) -> None:
    """No module of `graph` (module -> the modules it imports) reaches itself."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        assert module not in path, (
            f"import cycle: {' -> '.join([*path[path.index(module) :], module])}"
        )
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_mongoformats_modules_import_each_other_without_cycles():
    graph = _mongoformats_graph()
    _assert_acyclic(graph)


def _package_imports(source: str, package: str, modules: set[str]) -> set[str]:
    """Which of `modules` (a flat package's, "package.name") `source` imports, any way at all:
    at the top, inside functions, under `if TYPE_CHECKING:` (ast.walk visits them all),
    absolute or relative (`from . import x`, `from .x import y`), and `from package import x`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative, within the (flat) package itself
                base = f"{package}.{base}" if base else package
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found & modules


def test_the_import_graph_counts_function_level_type_checking_and_relative_imports():
    modules = {f"pkg.{name}" for name in "abcdef"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import a\n"
        "from .b import thing\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.c import Kind\n"
        "def f():\n"
        "    import pkg.d\n"
        "    from pkg import e\n"
    )
    assert _package_imports(source, "pkg", modules) == modules - {"pkg.f"}


def test_mongoformats_has_no_import_cycle_of_any_kind_of_import():
    """The review named keystring/keystring_decimal; every pair and longer circle counts."""
    paths = sorted((ROOT / "mongoformats").glob("*.py"))
    modules = {f"mongoformats.{p.stem}" for p in paths}
    graph = {
        f"mongoformats.{p.stem}": _package_imports(p.read_text(), "mongoformats", modules)
        - {f"mongoformats.{p.stem}"}
        for p in paths
    }
    assert graph["mongoformats.keystring"] >= {"mongoformats.keystring_decimal"}
    _assert_acyclic(graph)


# What mongoformats may import besides the standard library: pymongo's bson (and its saslprep),
# the wire compressors' and checksum's libraries, and re2 (a query's $regex in linear time).
FORMATS_THIRD_PARTY = {"bson", "pymongo", "zstandard", "cramjam", "crc32c", "re2"}


def test_mongoformats_imports_only_the_standard_library_bson_and_the_compressors():
    for path in (ROOT / "mongoformats").glob("*.py"):
        for module, _ in _imports(path):
            top = module.split(".")[0]
            assert top in sys.stdlib_module_names | FORMATS_THIRD_PARTY | {"mongoformats"}, (
                f"mongoformats/{path.name} imports {module}"
            )


# The engine and the proxy: the engine states what it needs from the proxy (buckets/ports.py)
# and never imports it; the proxy builds and wires the engine in its composition root only.
COMPOSITION_ROOTS = {"app.py", "__main__.py"}


def _modules_imported(path: pathlib.Path) -> set[str]:
    """Every module `path` imports, anywhere in it: at the top, inside functions, and under
    `if TYPE_CHECKING:` (ast.walk visits them all)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: within the package itself
                found.add(path.parent.name)
            elif node.module:
                found.add(node.module)
    return found


def test_the_engine_imports_nothing_of_the_proxy():
    for path in (ROOT / "buckets").rglob("*.py"):
        for module in _modules_imported(path):
            where = path.relative_to(ROOT)
            assert module.split(".")[0] != "wireproxy", f"{where} imports {module}"


def test_the_proxy_imports_the_engine_only_in_its_composition_root():
    for path in (ROOT / "wireproxy").rglob("*.py"):
        if path.name in COMPOSITION_ROOTS and path.parent == ROOT / "wireproxy":
            continue
        for module in _modules_imported(path):
            assert module.split(".")[0] != "buckets", f"wireproxy/{path.name} imports {module}"


def test_the_import_check_sees_deferred_and_type_checking_imports(tmp_path):
    """The rule above also catches the imports that hide a dependency from a first reading."""
    path = tmp_path / "hidden.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from wireproxy.router import X\n"
        "def f():\n    import wireproxy.upstream\n"
    )
    assert {"wireproxy.router", "wireproxy.upstream"} <= _modules_imported(path)


def test_the_proxys_reader_process_bound_is_the_engines():
    """The proxy's configuration is checked without loading the engine, so it keeps its own copy
    of the engine's bound on reader processes."""
    from buckets.commands import MAX_READER_PROCESSES
    from wireproxy.config import MAX_READER_PROCESSES as PROXY_MAX
    from wireproxy.config import ProxyConfig

    assert PROXY_MAX == MAX_READER_PROCESSES
    bounds = {f.name: f.metadata["range"] for f in dataclasses.fields(ProxyConfig)}
    assert bounds["reader_processes"] == (0, MAX_READER_PROCESSES)


def test_the_demo_is_imported_by_nothing_but_tests_and_benchmarks():
    assert (ROOT / "demo" / "embedded.py").exists()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for module, _ in _imports(path):
                assert module.split(".")[0] != "demo", f"{path.relative_to(ROOT)} imports {module}"


# The engine's sans-IO cores: synchronous, unit-tested without sockets or an event loop.
ENGINE_PURE_CORES = (
    "buckets.commands",
    "buckets.watch_command",
    "buckets.memory_limit",
    "buckets.reply",
    "buckets.scope",
    "buckets.ddl_notes",
    "buckets.merge",
    "buckets.catch_up",
)


def _buckets_graph() -> dict[str, set[str]]:
    """Which modules each buckets module imports, anywhere in it (functions, TYPE_CHECKING)."""
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "buckets").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[name] = {module for module, _ in _imports(path)} - {name}
    return graph


def test_the_engines_pure_cores_import_no_trio():
    graph = _buckets_graph()
    for core in ENGINE_PURE_CORES:
        seen, todo = set(), [core]
        while todo:
            module = todo.pop()
            if module in seen:
                continue
            seen.add(module)
            assert "trio" not in graph[module], f"{core} reaches trio through {module}"
            todo += [m for m in graph[module] if m.startswith("buckets.") and m in graph]


def test_buckets_modules_import_each_other_without_cycles():
    graph = {
        module: {m for m in imported if m.startswith("buckets.") and m != "buckets"}
        for module, imported in _buckets_graph().items()
        if module != "buckets"
    }
    _assert_acyclic(graph)


def _wireproxy_graph() -> dict[str, set[str]]:
    """Which wireproxy modules each one imports, anywhere in it (functions, TYPE_CHECKING); the
    package's `__init__` is the module `wireproxy`."""
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "wireproxy").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[name] = {
            module
            for module, _ in _imports(path)
            if module.split(".")[0] == "wireproxy" and module != name
        }
    return graph


def test_wireproxy_modules_import_each_other_without_cycles():
    """The session states what it uses of its server as a Protocol (session.SessionHost) rather
    than importing the server that imports it."""
    graph = _wireproxy_graph()
    assert "wireproxy.session" in graph and "wireproxy.server" in graph["wireproxy"]
    _assert_acyclic(graph)


# -- simcluster ------------------------------------------------------------------------------------


def _simcluster_graph() -> dict[str, set[str]]:
    """Which simcluster modules each one imports, anywhere in it (functions, TYPE_CHECKING);
    `from simcluster import query` counts as importing simcluster.query."""
    names = {f"simcluster.{p.stem}" for p in (ROOT / "simcluster").glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "simcluster").glob("*.py"):
        name = f"simcluster.{path.stem}"
        imported = {
            f"{module}.{alias}" if f"{module}.{alias}" in names else module
            for module, alias in _imports(path)
        }
        graph[name] = {m for m in imported if m in names and m not in (name, "simcluster.__init__")}
    return graph


def test_simcluster_modules_import_each_other_without_cycles():
    """The whole simulator's import graph, deferred and TYPE_CHECKING imports included: a part
    that needs another's objects states what it needs as a protocol (simcluster/roles.py,
    simcluster/router_roles.py) or is handed it (query.run_inserts asks its node for the
    inserts sent) instead of importing the module that imports it."""
    _assert_acyclic(_simcluster_graph())


def test_the_simcluster_graph_sees_package_relative_imports(tmp_path):
    """`from simcluster import query as q` is an edge to simcluster.query."""
    graph = _simcluster_graph()
    assert "simcluster.query" in graph["simcluster.mongos_crud"]
    assert "simcluster.node" in graph["simcluster.config_server"]


# What simcluster may import besides the standard library: the formats package, pymongo's bson,
# and trio. It stands in for a MongoDB cluster, so nothing of the proxy or the engine.
SIMCLUSTER_ALLOWED = {"simcluster", "mongoformats", "bson", "trio"}


def test_simcluster_imports_only_mongoformats_bson_trio_and_the_standard_library():
    """Every module, __main__ included, and every import statement in it."""
    for path in (ROOT / "simcluster").glob("*.py"):
        for module, _ in _imports(path):
            top = module.split(".")[0]
            allowed = top in SIMCLUSTER_ALLOWED or top in sys.stdlib_module_names
            assert allowed, f"simcluster/{path.name} imports {module}"


# The two implementations of the engine's event run (buckets/event_run.py): only they know how
# events are held (an EventFields tuple's EV_* indices, an EventBlock's columns).
RUN_IMPLEMENTATIONS = {ROOT / "buckets" / "event_run.py", ROOT / "buckets" / "_columnar"}


def _event_layout_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) for each name, attribute or imported name that is an EV_* index or
    EventBlock."""
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
        found += [
            (getattr(node, "lineno", 0), name)
            for name in names
            if name == "EventBlock" or (name.startswith("EV_") and name[3:].isupper())
        ]
    return found


def test_only_the_event_run_implementations_know_how_events_are_held():
    found = []
    for package in ("buckets", "wireproxy"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path in RUN_IMPLEMENTATIONS or RUN_IMPLEMENTATIONS & set(path.parents):
                continue
            found += [
                f"{path.relative_to(ROOT)}:{line} uses {name}"
                for line, name in _event_layout_names(ast.parse(path.read_text()))
            ]
    assert found == []


def test_the_event_layout_check_sees_indices_imports_and_attributes():
    code = "from m import EV_RAW, EventBlock\nx = ev[EV_RAW]\ny = blocks.EventBlock\nEV_raw = 1\n"
    names = sorted(name for _, name in _event_layout_names(ast.parse(code)))
    assert names == ["EV_RAW", "EV_RAW", "EventBlock", "EventBlock"]
