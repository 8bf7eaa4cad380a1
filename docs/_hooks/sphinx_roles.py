"""mkdocs hook: the docstrings' Sphinx roles (:class:`x`, :func:`~a.b.c`) rendered as code.

The docstrings are written for ``help()`` and IDEs as much as for this site, so they keep
reStructuredText roles; mkdocstrings renders docstrings as Markdown and would print the role
names. Here a role becomes its target in code (the last dotted part after a ``~``), and a
paragraph ending in the reST literal marker ``::`` ends in one colon, its code block following.
"""

import re

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):<code>(~?)([^<]+)</code>")
LITERAL_MARKER = re.compile(r"::</p>")


def _role(m: re.Match) -> str:
    short, target = m.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if short else target}</code>"


def on_page_content(html: str, **kwargs) -> str:
    return LITERAL_MARKER.sub(":</p>", ROLE.sub(_role, html))
