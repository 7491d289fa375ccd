"""The package's floors, measured from its imports (parsed with ``ast``, nothing imported).

From the bottom: the errors; ``core/`` (Redis, keys, validation, the Connection, the handle
contract, the heartbeat); ``kinds/`` (the lock kinds); ``admin/`` (listing and clearing);
the Celery layer (``celery/``); the front ends (``client.py``, ``aio/``, ``cli/``). Each
floor imports only floors below it, and the whole package has no import circle; no module
of it is a mere re-export of another. Every import counts, type-only ones and the ones made
lazily inside a function too.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

import celery_singleton_lock

PACKAGE = Path(celery_singleton_lock.__file__).resolve().parent
NAME = "celery_singleton_lock"
ERRORS = f"{NAME}.exceptions"
CORE = f"{NAME}.core"
KINDS = f"{NAME}.kinds"
ADMIN = f"{NAME}.admin"
CELERY_LAYER = f"{NAME}.celery"
AIO = f"{NAME}.aio"
CLI = f"{NAME}.cli"
#: Third-party packages of the Celery layer and the command line.
UPPER_LIBRARIES = {"celery", "kombu", "billiard", "click"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_statements(path: Path) -> Iterator[tuple[str, list[str]]]:
    """Each import of ``path`` as (the absolute module named, the names taken from it):
    ``import a.b`` gives ("a.b", []), ``from ..x import y`` ("<package>.x", ["y"])."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target, [alias.name for alias in node.names]


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; ``from x import y`` counts as x.y too)."""
    found: set[str] = set()
    for target, names in import_statements(path):
        found.add(target)
        found.update(f"{target}.{name}" for name in names)
    return found


def package_modules() -> dict[str, set[str]]:
    return {module_name(path): imports_of(path) for path in PACKAGE.rglob("*.py")}


def edges_of(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` loads: ``from . import x`` the submodule ``x`` when there
    is one (not the package, whose ``__init__`` Python runs first for any submodule anyway),
    ``from p import name`` the module ``p``."""
    found: set[str] = set()
    for target, names in import_statements(path):
        submodules = {f"{target}.{name}" for name in names} & modules
        found |= submodules
        if len(submodules) < len(names) or not names:
            found.add(target)  # a name defined in ``target`` (or a plain ``import target``)
    return (found & modules) - {module_name(path)}


def import_graph() -> dict[str, set[str]]:
    """Every package module -> the package modules it loads (see :func:`edges_of`)."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: edges_of(path, set(paths)) for name, path in paths.items()}


def in_floor(module: str, floor: str) -> bool:
    """``module`` is ``floor`` or inside it (``cli`` does not contain ``client``)."""
    return module == floor or module.startswith(floor + ".")


def upward(floor: str, allowed: Callable[[str], bool]) -> dict[str, list[str]]:
    """For each module of ``floor``, the package modules it imports that ``allowed`` refuses."""
    found = {
        name: sorted(target for target in targets if not allowed(target))
        for name, targets in import_graph().items()
        if in_floor(name, floor)
    }
    return {name: targets for name, targets in found.items() if targets}


def within(*floors: str) -> Callable[[str], bool]:
    return lambda module: any(in_floor(module, floor) for floor in floors)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (module -> modules it imports) as ``[a, b, ..., a]``, or
    None. Edges to names that are not keys of ``graph`` are not followed."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for target in sorted(graph[node]):
            if target in on_path:
                return path[path.index(target) :] + [target]
            if target in graph and target not in done:
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


def is_reexport(path: Path) -> bool:
    """A module made of nothing but imports (and ``__all__``): it runs no code of its own."""
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


# -- the measuring tools measure ---------------------------------------------------------------


def test_find_cycle_finds_a_circle_and_only_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a"}}) is None
    # Two paths to one module are not a circle; an edge out of the graph is not followed.
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": {"x"}}) is None


def test_is_reexport_tells_a_shim_from_a_module(tmp_path: Path) -> None:
    shim = tmp_path / "shim.py"
    shim.write_text('"""Old path."""\n\nfrom .x import *\nfrom .x import y\n\n__all__ = ["y"]\n')
    module = tmp_path / "module.py"
    module.write_text('"""A module."""\n\nfrom .x import y\n\nZ = y()\n')
    assert is_reexport(shim)
    assert not is_reexport(module)


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    # Relative imports resolve to the module they name, so ``from ..x import y`` out of the
    # core could not pass unseen.
    assert ERRORS in graph[f"{CORE}.validate"]
    assert f"{CORE}.redis_urls" in graph[f"{CORE}.notifier"]
    assert f"{CORE}.handle" in graph[f"{KINDS}.lease"]
    # ``from . import intervals`` loads the submodule, not the package's __init__.
    assert f"{KINDS}.intervals" in graph[f"{KINDS}.rwlock"]
    assert KINDS not in graph[f"{KINDS}.rwlock"]
    # A lazy import inside a function counts as well.
    assert f"{CORE}.heartbeat" in graph[f"{CORE}.handle"]
    assert f"{CELERY_LAYER}.options" in graph[f"{CELERY_LAYER}.task"]


# -- each floor imports only floors below it ----------------------------------------------------


def test_the_core_imports_only_itself_and_the_errors() -> None:
    assert {f"{CORE}.keys", f"{CORE}.connection", f"{CORE}.heartbeat"} <= set(import_graph())
    assert upward(CORE, within(CORE, ERRORS)) == {}


def test_the_kinds_import_only_the_core_the_errors_and_other_kinds() -> None:
    assert upward(KINDS, within(CORE, ERRORS, KINDS)) == {}


def test_admin_imports_only_the_core_the_errors_the_kinds_and_itself() -> None:
    assert upward(ADMIN, within(CORE, ERRORS, KINDS, ADMIN)) == {}


def test_the_celery_layer_imports_no_front_end_but_the_client() -> None:
    # LockClient is the facade the layer makes its app's lock client with.
    assert upward(CELERY_LAYER, lambda target: not within(AIO, CLI)(target)) == {}


def test_nothing_below_the_celery_layer_imports_celery_or_the_command_line() -> None:
    lower = within(CORE, KINDS, ADMIN, ERRORS)
    libraries = {
        name: sorted(target for target in found if target.partition(".")[0] in UPPER_LIBRARIES)
        for name, found in package_modules().items()
        if lower(name)
    }
    assert {name: found for name, found in libraries.items() if found} == {}
    assert upward(CORE, lambda t: not within(CELERY_LAYER, CLI, AIO, f"{NAME}.client")(t)) == {}


def test_only_the_package_imports_aio_and_inside_it_only_its_init_the_client() -> None:
    graph = import_graph()
    outside = {
        name: sorted(t for t in found if in_floor(t, AIO))
        for name, found in graph.items()
        if name != NAME and not in_floor(name, AIO)
    }
    assert {name: found for name, found in outside.items() if found} == {}
    importers = sorted(
        name for name, found in graph.items() if in_floor(name, AIO) and f"{AIO}.client" in found
    )
    assert importers == [AIO]


# -- no circles ---------------------------------------------------------------------------------


def test_the_whole_package_imports_in_no_circle() -> None:
    graph = import_graph()
    assert len(graph) > 50  # every module, package __init__s included
    assert find_cycle(graph) is None


def test_no_module_only_reexports_another() -> None:
    """One path for each thing: a package's ``__init__`` gathers its public names, and every
    other module has code of its own."""
    shims = sorted(
        module_name(path)
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" and is_reexport(path)
    )
    assert shims == []
