"""A test skips only for the cause its message names: no handler that catches every
exception (`except:`, `except Exception`, `except BaseException`) turns what it caught into
a skip, or a real bug would read as "not available here". Read from the source (`ast`)."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
BROAD = {"Exception", "BaseException"}


def broad_skips(source: str) -> list[int]:
    """Lines of the handlers in `source` that catch every exception and call `pytest.skip`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ExceptHandler):
            continue
        caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        if not any(t is None or (isinstance(t, ast.Name) and t.id in BROAD) for t in caught):
            continue
        calls = (n.func for stmt in node.body for n in ast.walk(stmt) if isinstance(n, ast.Call))
        if any(isinstance(f, ast.Attribute) and f.attr == "skip" for f in calls):
            found.append(node.lineno)
    return found


def test_the_check_sees_a_broad_handler_that_skips():
    source = ("import pytest\ntry:\n    f()\nexcept Exception as err:\n    pytest.skip(str(err))\n"
              "try:\n    g()\nexcept OSError:\n    pytest.skip('no file')\n")
    assert broad_skips(source) == [4]


def test_no_test_turns_every_exception_into_a_skip():
    found = {path.name: lines for path in sorted(TESTS.glob("*.py"))
             if (lines := broad_skips(path.read_text()))}
    assert found == {}, f"narrow these to the cause the skip names (as tests/offline_data.py does): {found}"
