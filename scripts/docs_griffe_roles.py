"""A Griffe extension for ``make docs``: Sphinx roles in docstrings (``:func:`refresh```) read as code in Markdown.

The docstrings use reST roles (they read well in ``help()`` and in the source); mkdocstrings renders Markdown,
where a role would print as ``:func:`` before the name. This turns ``:func:`x```, ``:class:`~a.B``` and the
like into plain inline code (``x``, ``B`` for a ``~`` name). Loaded by mkdocs.yml; never imported by the package.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|data|exc|mod|obj|const):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    name = match.group(2)
    return f"`{name.rsplit('.', 1)[-1] if match.group(1) else name}`"


class SphinxRoles(griffe.Extension):
    """Rewrite each docstring's Sphinx roles as inline code once the object tree is built."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring in place."""
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_code, obj.docstring.value)
