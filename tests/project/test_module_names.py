"""No module of pylease shadows a name it exports: ``pylease.leader`` is the function
whatever was imported before (a submodule ``pylease/leader.py`` would replace the
attribute with itself once anything imported it)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pylease


def test_no_submodule_is_named_like_an_export() -> None:
    modules = {m.name for m in pkgutil.iter_modules(pylease.__path__)}
    assert not modules & set(pylease.__all__)


def test_the_exports_stay_functions_after_every_module_is_imported() -> None:
    for info in pkgutil.iter_modules(pylease.__path__):
        if info.name != "__main__":
            importlib.import_module(f"pylease.{info.name}")
    for name in ("leader", "exclusive", "lease", "alease", "current_leader"):
        assert inspect.isfunction(getattr(pylease, name)), name
    from pylease import exclusive, leader
    from pylease.decorators import exclusive as exclusive_in_decorators
    from pylease.leadership import leader as leader_in_leadership

    assert leader is leader_in_leadership
    assert exclusive is exclusive_in_decorators
