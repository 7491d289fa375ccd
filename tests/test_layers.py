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
