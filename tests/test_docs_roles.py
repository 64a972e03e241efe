"""The API reference renders the docstrings' Sphinx roles (``:func:`mpqr.qr``` ...) as
cross-references (docs/hooks/sphinx_roles.py, a griffe extension), and the site build fails
on a role left raw (docs/hooks/raw_roles.py, an MkDocs hook); both are registered in
mkdocs.yml. The full build runs in tests/test_docs.py::test_mkdocs_build_strict."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "docs" / "hooks"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"docs_hooks_{name}", HOOKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pytest.importorskip("griffe")  # the docs extra, which the hook extends
roles = _load("sphinx_roles")


def test_mkdocs_yml_registers_the_extension_and_the_hook():
    text = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^hooks:\n  - docs/hooks/raw_roles\.py$", text, re.M), text
    assert "- docs/hooks/sphinx_roles.py:SphinxRoles" in text
    assert re.search(r"^exclude_docs: \|\n  hooks/$", text, re.M)  # not copied to the site


@pytest.mark.parametrize("target, owner, ident", [
    # the import path users write: mpqr.qr is the function, not the subpackage
    ("mpqr.qr", None, "mpqr.qr.api.qr"),
    ("mpqr.BreakdownError", None, "mpqr._errors.BreakdownError"),
    ("mpqr.qr.cholqr_steps", None, "mpqr.qr.cholqr_steps"),  # a module under the function
    ("mpqr.backends.get_backend", None, "backends.get_backend"),  # as the site names it
    ("gemm", "mpqr.policy.policy.gemm_sub", "mpqr.policy.policy.gemm"),  # module scope
    ("small", "backends._base.ArrayAPIBackend.gemm", "backends._base.ArrayAPIBackend.small"),
    ("lstsq", "compat.scipy", "compat.scipy.lstsq"),  # the scope's own first
    ("explain", "compat.scipy", "mpqr.policy.trace.explain"),  # then what mpqr exports
    ("scipy.linalg.qr", None, None),  # another library's: left as written
    ("mpqr.no_such_thing", None, None),
])
def test_identifier_of(target, owner, ident):
    assert roles.identifier_of(target, owner) == ident


def test_replace_roles_forms():
    out = roles.replace_roles(
        "See :func:`~mpqr.policy.gemm_sub`, :py:class:`mpqr.LinAlgError`, "
        ":meth:`the small path <small>` and :func:`scipy.linalg.qr`.",
        "backends._base.ArrayAPIBackend.gemm")
    assert out == (
        'See <autoref identifier="mpqr.policy.policy.gemm_sub" optional><code>gemm_sub</code>'
        '</autoref>, <autoref identifier="mpqr._errors.LinAlgError" optional>'
        "<code>mpqr.LinAlgError</code></autoref>, "
        '<autoref identifier="backends._base.ArrayAPIBackend.small" optional>'
        "<code>the small path</code></autoref> and "
        '<autoref identifier="scipy.linalg.qr" optional><code>scipy.linalg.qr</code></autoref>.')


def test_every_role_in_the_sources_is_rewritten():
    n = 0
    for folder in ("mpqr", "backends", "compat"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            n += len(roles.ROLE.findall(text))
            assert not roles.ROLE.search(roles.replace_roles(text)), path
    assert n > 100  # the docstrings do use roles; the rewrite has work to do


def test_griffe_loads_docstrings_without_raw_roles():
    griffe = pytest.importorskip("griffe")
    ext = griffe.load_extensions(f"{HOOKS / 'sphinx_roles.py'}:SphinxRoles")
    compat = griffe.load("compat", search_paths=[str(ROOT)], extensions=ext)
    doc = compat["scipy"].docstring.value
    assert "<autoref identifier=" in doc and not roles.ROLE.search(doc), doc


def test_the_build_fails_on_a_raw_role():
    pytest.importorskip("mkdocs")
    from mkdocs.exceptions import PluginError

    hook = _load("raw_roles")

    class Page:
        class file:
            src_uri = "api/mpqr.md"

    clean = '<p>See <a href="#x"><code>mpqr.qr</code></a>, a time of 10:30.</p>'
    assert hook.on_page_content(clean, page=Page) == clean
    for raw in ("<p>See :func:<code>mpqr.qr</code>.</p>", "<p>:py:mod:`x`</p>",
                "<td>:meth:<code>small</code></td>"):
        with pytest.raises(PluginError, match=r"api/mpqr\.md: raw Sphinx role"):
            hook.on_page_content(raw, page=Page)
