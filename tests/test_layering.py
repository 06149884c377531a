"""The format package is pure: no trio, no sockets, and it imports no other package of ours."""

import ast
import dataclasses
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
    path.write_text("from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from wireproxy.router import X\n"
                    "def f():\n    import wireproxy.upstream\n")
    assert {"wireproxy.router", "wireproxy.upstream"} <= _modules_imported(path)


def test_the_proxys_reader_process_bound_is_the_engines():
    """The proxy's configuration is checked without loading the engine, so it keeps its own copy
    of the engine's bound on reader processes."""
    from buckets.engine import MAX_READER_PROCESSES
    from wireproxy.config import MAX_READER_PROCESSES as PROXY_MAX
    from wireproxy.config import ProxyConfig

    assert PROXY_MAX == MAX_READER_PROCESSES
    bounds = {f.name: f.metadata["range"] for f in dataclasses.fields(ProxyConfig)}
    assert bounds["reader_processes"] == (0, MAX_READER_PROCESSES)
