"""Rules of the test suite itself: no module under tests/ imports a test_*.py module. What several files
share lives in tests/support/ (or a helper module beside the tests), so editing one test file breaks
no other and running one file runs only its own tests. And the one wait they share says what it waited for."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.waiting import wait_for

TESTS = Path(__file__).resolve().parent


def imported_test_modules(source: str) -> list[str]:
    """The test_* modules a module's source imports (anywhere in it: a lazy import counts too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
            if not node.module:  # `from . import test_x`
                modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found += [module for module in modules if module.rsplit(".", 1)[-1].startswith("test_")]
    return found


def test_the_rule_sees_every_way_of_importing_a_test_module() -> None:
    source = """
from tests.test_live import wait_for
import tests.test_chart
from .test_alerts import rules
from . import test_dashboard

def later():
    from tests.e2e.test_19_dra import allocation

from tests.support.waiting import wait_for
from tests.fakeapi import FakeApiServer
import pytest_timeout
"""
    assert imported_test_modules(source) == ["tests.test_live", "tests.test_chart", "test_alerts", "test_dashboard",
                                             "tests.e2e.test_19_dra"]


def test_no_module_under_tests_imports_a_test_module() -> None:
    offenders = {str(path.relative_to(TESTS.parent)): found for path in sorted(TESTS.rglob("*.py"))
                 if (found := imported_test_modules(path.read_text()))}
    assert offenders == {}, "move what is shared into tests/support/ and import it from there"


def test_wait_for_returns_what_held_and_names_what_it_waited_for() -> None:
    assert wait_for(lambda: 42) == 42
    with pytest.raises(AssertionError, match=r"timed out after 0\.05 s waiting for the quota written"):
        wait_for(lambda: None, 0.05, "the quota written")
    with pytest.raises(AssertionError, match=r"waiting for .*lambda: \[\] == \[1\]"):  # unnamed: its source
        wait_for(lambda: [] == [1], 0.05)
