"""The package's layers, measured from its imports (parsed with ``ast``, nothing imported).

The bottom floor, ``celery_singleton_lock.core``, may import only itself and the errors
module: nothing of Celery, the admin view, the CLI or the lock kinds above it. Every import
counts, including the ones made lazily inside a function.

Nothing below the Celery layer (the core, the lock kinds, the admin view) imports it or the
command line, and the modules of those two import each other in no circle.
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


# -- the Celery layer and the command line ---------------------------------------------------

#: The floors below the Celery layer: the core, the lock kinds (at their old top-level paths
#: too) and the admin view.
BELOW_CELERY = (
    "core",
    "kinds",
    "admin",
    "handle",
    "heartbeat",
    "lease",
    "multi",
    "intervals",
    "rwlock",
    "rangelock",
)
#: The Celery layer and the command line: their imports among themselves form no circle.
UPPER = ("celery", "cli")


def within(module: str, package: str) -> bool:
    """``module`` is ``package`` or one of its submodules (``cli`` does not contain ``client``)."""
    return module == package or module.startswith(package + ".")


def is_reexport(path: Path) -> bool:
    """A module made of nothing but imports (and ``__all__``): an old path or a package's
    re-export of its modules, which runs no code of its own."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return all(
        isinstance(node, (ast.Import, ast.ImportFrom))
        or (
            isinstance(node, ast.Assign)
            and [getattr(target, "id", None) for target in node.targets] == ["__all__"]
        )
        for node in body
    )


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of ``graph`` (module -> modules it imports) as ``[a, b, ..., a]``, or None.
    Edges to modules outside the graph are ignored."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for target in sorted(graph[node]):
            if target not in graph or target in done:
                continue
            if target in on_path:
                return path[path.index(target) :] + [target]
            found = visit(target)
            if found is not None:
                return found
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            found = visit(start)
            if found is not None:
                return found
    return None


def upper_graph() -> dict[str, set[str]]:
    """The imports among the modules of the Celery layer and the command line, re-exports
    left out."""
    upper = {
        module_name(path): imports_of(path)
        for path in PACKAGE.rglob("*.py")
        if any(within(module_name(path), f"{NAME}.{package}") for package in UPPER)
        and not is_reexport(path)
    }
    return {
        name: {target for target in found if target in upper} - {name}
        for name, found in upper.items()
    }


def test_find_cycle_finds_a_circle_and_only_a_circle() -> None:
    circle = {"a": {"b"}, "b": {"c", "x"}, "c": {"a"}, "d": {"a"}}
    found = find_cycle(circle)
    assert found is not None
    assert found[0] == found[-1]
    assert set(found) == {"a", "b", "c"}
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_is_reexport_tells_a_shim_from_a_module(tmp_path: Path) -> None:
    shim = tmp_path / "shim.py"
    shim.write_text('"""Old path."""\n\nfrom .x import *\nfrom .x import y\n\n__all__ = ["y"]\n')
    module = tmp_path / "module.py"
    module.write_text('"""A module."""\n\nfrom .x import y\n\nZ = y()\n')
    assert is_reexport(shim)
    assert not is_reexport(module)


def test_nothing_below_the_celery_layer_imports_it_or_the_cli() -> None:
    modules = package_modules()
    below = [
        name for name in modules if any(within(name, f"{NAME}.{floor}") for floor in BELOW_CELERY)
    ]
    assert {f"{NAME}.core.keys", f"{NAME}.admin"} <= set(below)
    upward = {
        name: sorted(
            target
            for target in modules[name]
            if any(within(target, f"{NAME}.{package}") for package in UPPER)
        )
        for name in below
    }
    assert {name: found for name, found in upward.items() if found} == {}


def test_the_celery_layer_and_the_cli_import_in_no_circle() -> None:
    graph = upper_graph()
    assert {f"{NAME}.celery.task", f"{NAME}.celery.worker", f"{NAME}.cli.commands"} <= set(graph)
    assert f"{NAME}.celery.options" in graph[f"{NAME}.celery.task"]  # the graph has its edges
    assert f"{NAME}.cli" not in graph  # a re-export
    assert find_cycle(graph) is None
