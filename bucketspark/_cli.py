"""What `pcs-replicate` shares with the other commands: `--version`, and a clear refusal when the
[spark] extra is missing (exit code 2, as argparse's usage errors, instead of a traceback).

Standard library only, so that it works in an install without the extra.

Why a copy of `wireproxy.extras` rather than one shared module: bucketspark talks to the proxy over
the wire only and imports none of its modules, and the one package both may import, mongoformats,
holds MongoDB's formats, not the distribution's name, version and extras that these helpers know
about. So each command package keeps this minimal version of its own, and
tests/integration/test_commands.py runs every command's `--version` and missing-extra refusal,
so the copies cannot drift apart unnoticed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Iterable

DISTRIBUTION = "parallelchangestream"


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        version = "unknown (not installed)"
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {version}",
        help="print the package's version and exit",
    )


def require_extra(prog: str, extra: str, modules: Iterable[str]) -> None:
    """Import `modules`; when one is missing, print which extra provides it and exit with code 2."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            sys.stderr.write(
                f"{prog}: needs the [{extra}] extra (module {exc.name or name!r} is not "
                f"installed); install it with: pip install '{DISTRIBUTION}[{extra}]'\n"
            )
            raise SystemExit(2) from None
