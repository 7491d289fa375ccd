"""The package's layers, measured from its imports (parsed with ``ast``, nothing imported).

The bottom floor, ``celery_singleton_lock.core``, may import only itself and the errors
module: nothing of Celery, the admin view, the CLI or the lock kinds above it. The lock kinds
(``kinds/``) import only the core, the errors and each other; ``admin`` only those and
itself; none of them the client, the CLI, the async client or the Celery layer; and the core,
the kinds, admin and ``client.py`` together form no import cycle. Every import counts,
including type-only ones and the ones made lazily inside a function.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
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


# -- the floors above the core: lock kinds, admin, and the client over them -----------------

KINDS = f"{NAME}.kinds"
ADMIN = f"{NAME}.admin"
ERRORS = f"{NAME}.exceptions"
#: Modules of the Celery layer and the front ends: nothing in core, kinds or admin imports them.
UPPER_MODULES = {
    f"{NAME}.{name}"
    for name in (
        "client", "cli", "output", "aio", "embedded", "__main__", "task", "config",
        "task_keys", "claims", "enqueue", "holders", "worker", "signals", "events",
        "prometheus", "evidence", "testing", "pytest_plugin",
    )
}  # fmt: skip


def in_floor(module: str, floor: str) -> bool:
    return module == floor or module.startswith(floor + ".")


def edges_of(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports, each import resolved to the module it loads:
    ``from . import x`` to the submodule ``x`` when there is one (not to the package, whose
    ``__init__`` Python runs first for every submodule anyway), ``from p import name`` to
    ``p``. Every import counts, type-only and in-function ones too."""
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
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in modules else target)
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    """Every package module -> the package modules it imports (see :func:`edges_of`)."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    names = set(paths)
    return {name: edges_of(path, names) for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None if it has none (depth-first)."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for target in sorted(graph.get(node, ())):
            if target in on_path:
                return path[path.index(target) :] + [target]
            if target not in done:
                cycle = visit(target)
                if cycle is not None:
                    return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle is not None:
                return cycle
    return None


def upward(floor_of: Callable[[str], bool], allowed: Callable[[str], bool]) -> dict[str, list[str]]:
    """For each module of a floor, what it imports of the package that ``allowed`` refuses."""
    graph = import_graph()
    found = {
        name: sorted(target for target in targets if not allowed(target))
        for name, targets in graph.items()
        if floor_of(name)
    }
    return {name: targets for name, targets in found.items() if targets}


def test_the_floor_finders_see_the_floors_and_their_imports() -> None:
    graph = import_graph()
    assert {f"{KINDS}.lease", f"{KINDS}.multi", f"{KINDS}.intervals"} <= set(graph)
    assert any(in_floor(name, ADMIN) for name in graph)
    assert f"{NAME}.core.handle" in graph[f"{KINDS}.lease"]
    # ``from . import intervals`` loads the submodule, not the package's __init__.
    assert f"{KINDS}.intervals" in graph[f"{KINDS}.rwlock"]
    assert KINDS not in graph[f"{KINDS}.rwlock"]
    # A lazy import inside a function counts as well.
    assert f"{NAME}.core.heartbeat" in graph[f"{NAME}.core.handle"]


def test_the_kinds_import_only_the_core_the_errors_and_other_kinds() -> None:
    def allowed(target: str) -> bool:
        return in_floor(target, f"{NAME}.core") or in_floor(target, KINDS) or target == ERRORS

    assert upward(lambda name: in_floor(name, KINDS), allowed) == {}


def test_admin_imports_only_the_core_the_errors_the_kinds_and_itself() -> None:
    def allowed(target: str) -> bool:
        return any(in_floor(target, floor) for floor in (f"{NAME}.core", KINDS, ADMIN, ERRORS))

    assert upward(lambda name: in_floor(name, ADMIN), allowed) == {}


def test_core_kinds_and_admin_import_no_client_cli_async_or_celery_layer() -> None:
    def lower(name: str) -> bool:
        return any(in_floor(name, floor) for floor in (f"{NAME}.core", KINDS, ADMIN))

    def allowed(target: str) -> bool:
        return not any(in_floor(target, upper) for upper in UPPER_MODULES)

    assert upward(lower, allowed) == {}
    libraries = {
        name: sorted(target for target in found if target.partition(".")[0] in UPPER_LIBRARIES)
        for name, found in package_modules().items()
        if lower(name)
    }
    assert {name: found for name, found in libraries.items() if found} == {}


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a"}}) is None


def test_core_kinds_admin_and_the_client_form_no_import_cycle() -> None:
    def member(name: str) -> bool:
        floors = (f"{NAME}.core", KINDS, ADMIN, f"{NAME}.client")
        return any(in_floor(name, floor) for floor in floors)

    graph = {
        name: {target for target in targets if member(target)}
        for name, targets in import_graph().items()
        if member(name)
    }
    assert f"{NAME}.client" in graph
    assert find_cycle(graph) is None
