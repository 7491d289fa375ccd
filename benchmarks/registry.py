"""The registry of benchmark sections that ``python -m benchmarks`` runs."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .context import Context
    from .report import Table

RunSection = Callable[["Context"], "list[Table]"]
AddArguments = Callable[[argparse._ArgumentGroup], None]


@dataclass(frozen=True)
class Section:
    """One named group of benchmarks, run by ``python -m benchmarks NAME``."""

    name: str
    title: str
    run: RunSection
    add_arguments: AddArguments | None = None
    order: int = 100  # sections run in this order, then by name


_SECTIONS: dict[str, Section] = {}


def section(
    name: str, title: str, *, add_arguments: AddArguments | None = None, order: int = 100
) -> Callable[[RunSection], RunSection]:
    """Register the decorated ``run(ctx) -> list[Table]`` as section ``name``.

    ``add_arguments`` adds the section's own command-line options (e.g. iteration counts)
    to an argument group; their values reach ``run`` as ``ctx.options``.
    """

    def register(run: RunSection) -> RunSection:
        if name in _SECTIONS:
            raise ValueError(f"benchmark section {name!r} registered twice")
        _SECTIONS[name] = Section(name, title, run, add_arguments, order)
        return run

    return register


def discover() -> list[Section]:
    """Import every module of this package (so each registers its sections); all sections."""
    package = __name__.rpartition(".")[0]
    path = importlib.import_module(package).__path__
    for module in pkgutil.iter_modules(path):
        if not module.name.startswith("_"):
            importlib.import_module(f"{package}.{module.name}")
    return sorted(_SECTIONS.values(), key=lambda s: (s.order, s.name))
