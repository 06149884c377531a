"""The README opens with the two setup commands and stays short
(tests/integration/test_readme.py runs its quickstart verbatim)."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_starts_with_the_two_setup_commands():
    first = re.search(r"```sh\n(.*?)```", README.read_text(), flags=re.S)
    assert first is not None
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]


def test_readme_is_short():
    assert len(README.read_bytes()) <= 25 * 1024
