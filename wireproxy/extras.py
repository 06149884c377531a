"""What every command shares: `--version`, and a clear refusal when an optional extra is missing.

The base install is the proxy; `simcluster`, `pcs-demo` and `pcs-replicate` need extras
(pyproject.toml). Without them a command says which extra to install and exits with code 2 (a
usage error, as argparse's), instead of a ModuleNotFoundError traceback. This module imports
nothing beyond the standard library, so it works in any install. bucketspark, which imports no
proxy code, keeps a minimal copy for `pcs-replicate` (bucketspark/_cli.py says why).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Iterable

DISTRIBUTION = "parallelchangestream"


def package_version() -> str:
    """The installed distribution's version (from its metadata, the one source of truth)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {package_version()}",
        help="print the package's version and exit",
    )


def require_extra(prog: str, extra: str, modules: Iterable[str]) -> None:
    """Import `modules`; when one is missing, print which extra provides it and exit with code 2."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing = exc.name or name
            plural = "s" if "," in extra else ""
            sys.stderr.write(
                f"{prog}: needs the [{extra}] extra{plural} (module {missing!r} is not installed); "
                f"install it with: pip install '{DISTRIBUTION}[{extra}]'\n"
            )
            raise SystemExit(2) from None
