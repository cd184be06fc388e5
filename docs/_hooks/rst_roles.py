"""A griffe extension for the API reference: jaxnet's docstrings use reStructuredText's roles
(:func:`jaxnet.load`) and literal blocks (``text::``), which Markdown would print as they are.
Each role becomes inline code and a paragraph ending in ``::`` ends in ``:`` (its indented
block is already a code block in Markdown). mkdocstrings has no option for this."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc|const):`~?([^`]+)`")


def markdown(text: str) -> str:
    """``text`` with reStructuredText roles as inline code and literal-block colons single."""
    text = ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    return re.sub(r"(\S)::$", r"\1:", text, flags=re.M)


class RstRoles(griffe.Extension):
    """Rewrites every docstring griffe loads (see :func:`markdown`)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
