"""The tests reach the package only through its public names, as its users do (parsed with
``ast``, nothing imported): no ``obj._name`` of a package object, no private name patched by
string (``monkeypatch.setattr(obj, "_name", ...)``), imported from the package, or overridden
in a test's subclass of a package class. A test that needs more than the public API says that
the package lacks a seam its users would want too.

What counts as private: a name starting with one underscore that the package itself defines
(an attribute, method, function or module global), reached on anything but the test's own
``self``/``cls`` (so the tests' own helpers and third-party objects pass, unless they
share a private name with the package). ``ALLOWED`` lists what is still reached, and why.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import celery_singleton_lock

PACKAGE = Path(celery_singleton_lock.__file__).resolve().parent
TESTS = Path(__file__).resolve().parent.parent
NAME = "celery_singleton_lock"

#: (file under tests/, private name): the package's internals a test still drives, because
#: what it pins has no public face yet. Each is a seam to find, not a licence: the list only
#: shrinks (``test_every_allowed_reach_is_still_made``).
STILL_REACHED: dict[tuple[str, str], str] = {
    # One acquire attempt as a given owner token, or one interval change, without the
    # waiting loop around it: the scripts' interleavings driven a round trip at a time.
    ("support/attempts.py", "_run"): "a handle's step runner",
    ("support/attempts.py", "_try_acquire"): "one acquire attempt as a given owner",
    ("support/attempts.py", "_change"): "one interval change",
    ("kinds/test_interval_wakeups.py", "_try_acquire"): "counting a blocked waiter's attempts",
    # The step runners (core/steps.py) are the contract between the core and the kinds.
    ("core/test_step_runners.py", "_run"): "the sync and asyncio runners of a handle's steps",
    # The unsubscriber's step driven by hand, to order it against a waiter coming back.
    ("core/test_notifier.py", "_lock"): "the notifier's lock, taken to swap its queue",
    ("core/test_notifier.py", "_ensure_threads"): "the listener threads started first",
    ("core/test_notifier.py", "_left"): "the queue of channels left, swapped",
    ("core/test_notifier.py", "_unsubscribe"): "the unsubscriber's step",
    # The default key's fast path, whose whole contract is naming as the general path does.
    ("tasks/test_task_keys_fast.py", "_plain_names"): "the fast path switched off in a twin",
    ("tasks/test_task_keys_fast.py", "_default_name_of_scalars"): "the str/int shortcut itself",
}

ALLOWED = STILL_REACHED


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and len(name) > 1


@functools.cache
def package_private_names() -> frozenset[str]:
    """Every private name the package defines: ``self._x = ...``, ``def _x``, ``_X = ...``,
    a class body's ``_x: T``, and ``__slots__`` entries."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                found.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.add(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)  # __slots__ entries, setattr names
    return frozenset(name for name in found if is_private(name))


def package_names_in(tree: ast.Module) -> set[str]:
    """The names a test module binds to the package's objects by importing them."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(NAME):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def reaches(tree: ast.Module, private: frozenset[str] | set[str]) -> Iterator[tuple[int, str, str]]:
    """(line, private name, how) for each private reach of ``tree`` into the package."""
    imported = package_names_in(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private:
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            yield node.lineno, node.attr, "attribute"
        elif isinstance(node, ast.Call):
            strings = [a.value for a in node.args if isinstance(a, ast.Constant)]
            for value in strings:
                if isinstance(value, str) and value in private:
                    yield node.lineno, value, "by string"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(NAME):
            for alias in node.names:
                if is_private(alias.name) or any(map(is_private, node.module.split("."))):  # type: ignore[union-attr]
                    yield node.lineno, alias.name, "import"
        elif isinstance(node, ast.ClassDef):
            bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
            if bases & imported:
                for item in node.body:
                    defines = isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                    if defines and item.name in private:
                        yield item.lineno, item.name, "override"


def private_reaches() -> list[str]:
    private = package_private_names()
    found: list[str] = []
    for path in sorted(TESTS.rglob("*.py")):
        relative = path.relative_to(TESTS).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, name, how in reaches(tree, private):
            if (relative, name) not in ALLOWED:
                found.append(f"{relative}:{line}: {name} ({how})")
    return found


def test_the_checker_finds_every_kind_of_reach() -> None:
    private = {"_renew", "_queued", "_client", "_renewed"}
    source = (
        "from celery_singleton_lock import Lease\n"
        "from celery_singleton_lock.core.heartbeat import _heartbeat\n"
        "class Mine(Lease):\n"
        "    def _renewed(self): ...\n"
        "def test(beat, monkeypatch):\n"
        "    beat._renew([])\n"
        "    self._queued\n"
        "    monkeypatch.setattr(app, '_client', None)\n"
    )
    found = sorted(how for _, _, how in reaches(ast.parse(source), private))
    assert found == ["attribute", "by string", "import", "override"]


def test_the_package_defines_the_private_names_the_tests_used_to_reach() -> None:
    # The measure measures: it knows the package's own private names, and not a test's.
    private = package_private_names()
    assert {"_renew", "_queued", "_run", "_describe_holder"} <= private
    assert "_interactive" in private and "public" not in private


def test_no_test_reaches_a_private_name_of_the_package() -> None:
    assert private_reaches() == []


def test_every_allowed_reach_is_still_made() -> None:
    """An entry of ``ALLOWED`` no test needs any more goes, so the list stays short."""
    private = package_private_names()
    made = {
        (path.relative_to(TESTS).as_posix(), name)
        for path in TESTS.rglob("*.py")
        for _, name, _ in reaches(ast.parse(path.read_text(encoding="utf-8")), private)
    }
    assert set(ALLOWED) <= made
