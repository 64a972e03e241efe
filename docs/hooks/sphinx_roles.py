"""Griffe extension: Sphinx roles in docstrings (``:func:`mpqr.qr```, ``:meth:`~X.small```,
``:mod:``, ``:class:``, ``:attr:``, ``:data:``, ``:exc:``, ``:obj:``) become mkdocs-autorefs
cross-references, so the API reference renders them as links (or as code where the target is
not on the site) instead of printing the role.

A role's target is resolved as Sphinx resolves it: a dotted path from the top (``mpqr.qr`` is
the function the package exports), else a name in the scope of the object whose docstring
holds it (its class, its module), else a name exported by ``mpqr``. Resolution imports the
objects, since the names users write are the import paths (``mpqr.qr`` is both a subpackage
and the function re-exported over it); the identifier is the defining module's path as the
site's API pages render it (``backends.`` and ``compat.`` for ``mpqr.backends.`` and
``mpqr.compat.``, which live at the top of the repository)."""

from __future__ import annotations

import html
import importlib
import re
from types import ModuleType
from typing import Any

import griffe

__all__ = ["ROLE", "SphinxRoles", "identifier_of", "replace_roles"]

ROLE = re.compile(
    r":(?:py:)?(?P<role>func|meth|mod|class|attr|data|exc|obj|const):"
    r"`(?P<body>[^`]+)`")
# folders at the top of the repository installed under mpqr (setuptools package-dir)
_SITE_PREFIX = {"mpqr.backends": "backends", "mpqr.compat": "compat"}
_IMPORT_PREFIX = {v: k for k, v in _SITE_PREFIX.items()}


def _walk(obj: Any, where: str, names: list[str]) -> str | None:
    """The defining path of ``obj.<names...>`` (attributes first, as ``mpqr.qr`` is the
    function over the subpackage of that name; else a submodule), or None."""
    dotted = where
    for name in names:
        if hasattr(obj, name):
            obj = getattr(obj, name)
        else:  # a submodule not imported yet, or one a function of its name hides
            try:
                obj = importlib.import_module(f"{dotted}.{name}")
            except ImportError:
                return None
        dotted = f"{dotted}.{name}"
        mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if isinstance(obj, ModuleType):
            where = obj.__name__
        elif isinstance(mod, str) and isinstance(qual, str) and "<" not in qual:
            where = f"{mod}.{qual}"
        else:  # data: the path it was reached by
            where = f"{where}.{name}"
    return where


def _scope(path: str) -> tuple[Any, str] | None:
    """The object defined at ``path`` (a module, then classes and functions in it)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, None)
        return (obj, path) if obj is not None else None
    return None


def _site_path(path: str) -> str:
    for imp, site in _SITE_PREFIX.items():
        if path == imp or path.startswith(imp + "."):
            return site + path[len(imp):]
    return path


def _import_path(path: str) -> str:
    head, _, rest = path.partition(".")
    return _IMPORT_PREFIX[head] + ("." + rest if rest else "") if head in _IMPORT_PREFIX else path


def identifier_of(target: str, owner: str | None = None) -> str | None:
    """The site identifier of a role's target, seen from the object at ``owner`` (a site
    path such as ``backends.cupy_backend.CupyBackend.small``); None if it does not resolve
    to an object of mpqr."""
    names = target.lstrip(".").split(".")
    scopes = []
    if owner:
        parts = _import_path(owner).split(".")
        scopes = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    for scope in scopes:
        found = _scope(scope)
        if found is not None and (where := _walk(*found, names)) is not None:
            return _site_path(where)
    if names[0] != "mpqr":
        names = ["mpqr", *names]
    where = _walk(importlib.import_module("mpqr"), "mpqr", names[1:])
    return _site_path(where) if where is not None else None


def replace_roles(text: str, owner: str | None = None) -> str:
    """``text`` with every Sphinx role replaced by an optional autorefs cross-reference."""

    def one(m: re.Match) -> str:
        body = m["body"].strip()
        explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^>]+)>", body)
        if explicit:
            title, target = explicit["title"], explicit["target"]
        else:
            target = body
            title = body[1:].rsplit(".", 1)[-1] if body.startswith("~") else body
        target = target.lstrip("~!")
        ident = identifier_of(target, owner) or target
        return (f'<autoref identifier="{html.escape(ident)}" optional>'
                f"<code>{html.escape(title)}</code></autoref>")

    return ROLE.sub(one, text)


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ROLE.search(obj.docstring.value):
            obj.docstring.value = replace_roles(obj.docstring.value, obj.path)
