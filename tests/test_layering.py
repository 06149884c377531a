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
