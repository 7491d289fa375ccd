"""docs/run-semantics.md's outcome table and docs/reliability.md's fault tables: every row
names a test that exists, so the tables cannot drift from the tests that hold them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
ROW = re.compile(r"^\| (\d+) \|")
NAMED = re.compile(r"`(test_[\w]+\.py)::(test_\w+)`")


def table_rows() -> list[tuple[int, list[tuple[str, str]]]]:
    text = (ROOT / "docs" / "run-semantics.md").read_text()
    start = text.index("## The outcome table")
    rows = []
    for line in text[start:].splitlines():
        match = ROW.match(line)
        if match:
            rows.append((int(match.group(1)), NAMED.findall(line)))
        elif rows and not line.startswith("|"):
            break
    return rows


def functions_in(file: str) -> set[str]:
    """The test functions of test file ``file``, in whichever folder of tests/ it is."""
    (path,) = (ROOT / "tests").rglob(file)
    tree = ast.parse(path.read_text())
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    return {node.name for node in tree.body if isinstance(node, functions)}


def test_every_row_of_the_run_semantics_table_names_a_test_that_exists() -> None:
    rows = table_rows()
    assert [number for number, _ in rows] == list(range(1, len(rows) + 1))
    assert len(rows) >= 20
    for number, named in rows:
        assert named, f"row {number} names no test"
        for file, name in named:
            assert name in functions_in(file), f"row {number}: {file}::{name}"


def test_every_test_the_reliability_page_names_exists() -> None:
    text = (ROOT / "docs" / "reliability.md").read_text()
    named = NAMED.findall(text)
    assert len(named) >= 40
    for file, name in named:
        assert name in functions_in(file), f"docs/reliability.md: {file}::{name}"
