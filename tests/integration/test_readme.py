"""The README's quickstart runs verbatim on a fresh machine: its shell block, as written, in a copy
of the repository (so that the install it makes leaves this checkout alone)."""

import pathlib
import re
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# What a fresh clone does not have: the developer's virtualenv, caches, installed npm packages.
_NOT_COPIED = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".node",
    "node_modules",
    "__pycache__",
    "*.egg-info",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "runs",
    "spark-warehouse",
    "build",
)


def section_blocks(text: str, heading: str, language: str) -> list[str]:
    """The fenced blocks of `language` in the section under `## heading` (up to the next `## `)."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def test_quickstart_runs_verbatim(tmp_path):
    blocks = section_blocks(README.read_text(), "Quickstart", "sh")
    assert len(blocks) == 1
    clone = tmp_path / "clone"
    shutil.copytree(ROOT, clone, ignore=_NOT_COPIED)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", blocks[0]],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("bucket ")]
    assert len(lines) == 6, done.stdout
    assert {line.split()[3] for line in lines} == {"orders", "customers"}
