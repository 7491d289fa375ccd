"""The package's layers, measured from its imports (parsed with ``ast``, nothing imported).

The bottom floor, ``celery_singleton_lock.core``, may import only itself and the errors
module: nothing of Celery, the admin view, the CLI or the lock kinds above it. Every import
counts, including the ones made lazily inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import celery_singleton_lock

PACKAGE = Path(celery_singleton_lock.__file__).resolve().parent
NAME = "celery_singleton_lock"
#: What the core may import from the package beside itself.
CORE_MAY_IMPORT = {f"{NAME}.exceptions"}
#: Third-party packages of the layers above the core.
UPPER_LIBRARIES = {"celery", "kombu", "billiard", "click"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; ``from x import y`` counts as x.y too)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def package_modules() -> dict[str, set[str]]:
    return {module_name(path): imports_of(path) for path in PACKAGE.rglob("*.py")}


def test_the_core_imports_only_itself_and_the_errors() -> None:
    modules = package_modules()
    core = {name for name in modules if name.startswith(f"{NAME}.core")}
    assert {f"{NAME}.core.keys", f"{NAME}.core.scripts", f"{NAME}.core.notifier"} <= core
    upward = {
        name: sorted(
            target
            for target in modules[name]
            if target in modules
            and target not in core
            and target not in CORE_MAY_IMPORT
            and target != NAME
        )
        for name in core
    }
    assert {name: found for name, found in upward.items() if found} == {}


def test_the_core_imports_nothing_of_celery_or_the_cli() -> None:
    modules = package_modules()
    libraries = {
        name: sorted(target for target in found if target.partition(".")[0] in UPPER_LIBRARIES)
        for name, found in modules.items()
        if name.startswith(f"{NAME}.core")
    }
    assert {name: found for name, found in libraries.items() if found} == {}


def test_relative_imports_resolve_to_the_module_they_name() -> None:
    # Else a relative import out of the core (``from ..x import y``) would pass unseen.
    assert f"{NAME}.exceptions.ConfigurationError" in imports_of(PACKAGE / "core" / "validate.py")
    assert f"{NAME}.core.redis_urls" in imports_of(PACKAGE / "core" / "notifier.py")


# -- the asyncio front end -------------------------------------------------------------------

AIO = f"{NAME}.aio"


def first_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (module -> what it imports) as ``[a, b, ..., a]``, or None.
    Edges to names that are not keys of ``graph`` are ignored."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        path.append(node)
        for target in sorted(graph[node]):
            if target in path:
                return path[path.index(target) :] + [target]
            if target in graph and target not in done:
                found = visit(target)
                if found is not None:
                    return found
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if node not in done:
            found = visit(node)
            if found is not None:
                return found
    return None


def aio_graph() -> dict[str, set[str]]:
    """The imports among the modules of ``aio``, without the package's ``__init__``: it only
    re-exports, and ``from . import x`` names it from inside."""
    modules = package_modules()
    inside = {name for name in modules if name.startswith(f"{AIO}.")}
    return {name: modules[name] & inside for name in inside}


def test_first_cycle_finds_a_hand_made_cycle_and_nothing_else() -> None:
    assert first_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert first_cycle({"a": {"a"}}) == ["a", "a"]
    assert first_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    # Two paths to one module are not a cycle; an edge out of the graph is not followed.
    assert first_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": {"x"}}) is None
    assert first_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]


def test_the_aio_modules_import_each_other_without_a_circle() -> None:
    graph = aio_graph()
    assert {f"{AIO}.{m}" for m in ("client", "connection", "handle", "heartbeat")} <= set(graph)
    assert f"{AIO}.connection" in graph[f"{AIO}.handle"]  # the graph has edges
    assert first_cycle(graph) is None


def test_in_aio_only_the_package_imports_the_client() -> None:
    graph = aio_graph()
    importers = sorted(name for name, found in graph.items() if f"{AIO}.client" in found)
    assert importers == []
    assert f"{AIO}.client" in package_modules()[AIO]


def test_nothing_outside_aio_but_the_package_imports_it() -> None:
    outside = {
        name: sorted(t for t in found if t == AIO or t.startswith(f"{AIO}."))
        for name, found in package_modules().items()
        if name != NAME and name != AIO and not name.startswith(f"{AIO}.")
    }
    assert {name: found for name, found in outside.items() if found} == {}
    assert AIO in package_modules()[NAME]  # AsyncLockClient, imported lazily
