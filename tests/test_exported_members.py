"""Each module's `__all__` is what it exports, pinned as httpx pins its own (tests/test_exported_members.py).

Every public function and class a module defines is in its `__all__`; one kept out of it is named with a
leading `_`. So the surface a reader sees at the top of a module is the whole of it, and a helper that
becomes internal says so by its name. The other direction (each name in `__all__` exists) is checked
too, though ruff's F822 already catches it where `__all__` is a literal. Constants are not checked: a
module's namespace cannot tell a constant it defines from one it imports. A module without `__all__`
(a package's `__init__`, base/names.py) defines no function or class.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

PACKAGES = ("gpu_placement", "extender", "webhook")


def _modules() -> list[str]:
    names = list(PACKAGES)
    for package in PACKAGES:
        names += [info.name for info in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}.")]
    return names


def _defined(name: str) -> list[str]:
    """The public functions and classes module `name` defines itself (not those it imports)."""
    module = importlib.import_module(name)
    return sorted(key for key, value in vars(module).items() if not key.startswith("_")
                  and (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == name)


def test_every_public_function_and_class_is_exported() -> None:
    unlisted: dict[str, list[str]] = {}
    for name in _modules():
        exported = getattr(importlib.import_module(name), "__all__", ())
        if missing := [key for key in _defined(name) if key not in exported]:
            unlisted[name] = missing
    assert unlisted == {}, "add each to its module's __all__, or name it with a leading _ if nothing else imports it"


def test_every_exported_name_exists_once() -> None:
    for name in _modules():
        exported = getattr(importlib.import_module(name), "__all__", None)
        if exported is None:
            continue
        module = importlib.import_module(name)
        assert [key for key in exported if not hasattr(module, key)] == [], name
        assert len(set(exported)) == len(exported), name


def test_the_walk_finds_the_modules() -> None:
    """The two tests above cannot pass by seeing nothing."""
    modules = _modules()
    assert len(modules) > 100
    assert {"gpu_placement.kube.api", "extender.app", "webhook.app", "gpu_placement.controllers.quota_mirror"} <= set(
        modules)
    assert "ApiNotFound" in _defined("gpu_placement.kube.api")
