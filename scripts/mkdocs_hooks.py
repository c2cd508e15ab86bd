"""mkdocs hooks of the documentation site (mkdocs.yml: ``hooks``).

flowwarden's docstrings name other objects with Sphinx roles (:class:`Connector`,
:meth:`~flowwarden.runtime.Connector.stop`), which help() shows as they are and which mkdocstrings
renders as the role's text followed by the name in code. This hook drops the role and, for the
``~`` form, keeps the last part of the name, as Sphinx would show it.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):<code>(~?)([^<]*)</code>")


def _shown(match: re.Match[str]) -> str:
    tilde, name = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if tilde else name}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    return _ROLE.sub(_shown, html)
