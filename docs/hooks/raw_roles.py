"""MkDocs hook: the build fails on a Sphinx role left as text in a page (``:func:`` and
the like, which the API reference would otherwise print literally)."""

from __future__ import annotations

import re

from mkdocs.exceptions import PluginError

__all__ = ["RAW_ROLE", "on_page_content"]

# a role as the HTML shows it once Markdown has turned its backquotes into <code>
RAW_ROLE = re.compile(
    r":(?:py:)?(?:func|meth|mod|class|attr|data|exc|obj|const):(?:<code>|`)")


def on_page_content(html: str, page, **kwargs) -> str:
    found = sorted({m.group(0) for m in RAW_ROLE.finditer(html)})
    if found:
        raise PluginError(f"{page.file.src_uri}: raw Sphinx role(s) in the rendered page: "
                         + ", ".join(found))
    return html
