"""The format package is pure: no trio, no sockets, and it imports no other package of ours."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
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
                assert top not in OURS | {"trio", "socket", "asyncio", "ssl"}, f"{path.name} imports {name}"


def test_importing_mongoformats_does_not_load_trio():
    code = "import sys, mongoformats, mongoformats.wire, mongoformats.change_events; print('trio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


# The engine's oplog-to-event transform. simcluster's change streams build their events with
# their own reference (simcluster/reference_events.py), so that a differential test compares two
# implementations instead of one with itself.
ENGINE_TRANSFORM = {"mongoformats.change_events", "mongoformats.oplog_splice", "mongoformats.batch_splice",
                    "mongoformats.event_block", "mongoformats.update_diff"}
# Byte-level BSON helpers that oplog_splice also holds and that build no event: a reply's cursor
# document and its parts for the wire, and a document's leading `_id` bytes.
WIRE_HELPERS = {("mongoformats.oplog_splice", "cursor_document"), ("mongoformats.oplog_splice", "document_parts"),
                ("mongoformats.oplog_splice", "leading_id")}
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
                assert (module, name) in WIRE_HELPERS, f"simcluster/{path.name} imports {name} from {module}"


def test_the_reference_transform_evaluates_nothing_with_the_engines_modules():
    for path in (ROOT / "simcluster").glob("reference_*.py"):
        for module, _ in _imports(path):
            assert module not in ENGINE_TRANSFORM | REFERENCE_ALSO, f"simcluster/{path.name} imports {module}"
            assert not module.startswith(("buckets", "wireproxy")), f"simcluster/{path.name} imports {module}"
    assert sorted(p.name for p in (ROOT / "simcluster").glob("reference_*.py")) == ["reference_diff.py",
                                                                                      "reference_events.py"]


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
    modules = sorted(f"bucketspark.{p.stem}" for p in (ROOT / "bucketspark").glob("*.py")
                     if p.stem != "__init__")
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'simcluster', 'wireproxy', 'buckets', 'demo'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_the_demo_is_imported_by_nothing_but_tests_and_benchmarks():
    assert (ROOT / "demo" / "embedded.py").exists()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for module, _ in _imports(path):
                assert module.split(".")[0] != "demo", f"{path.relative_to(ROOT)} imports {module}"
