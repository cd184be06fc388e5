"""A griffe extension for the API reference: jaxnet's docstrings use reStructuredText's roles
(:func:`jaxnet.load`), literal blocks (``text::``) and doctest examples (``>>> ...``), which
Markdown would print as they are (or read ``x["a"]["b"]`` in an example as a link). Each role
becomes inline code, a paragraph ending in ``::`` ends in ``:`` (its indented block is already a
code block in Markdown), and each run of doctest lines becomes a fenced ``pycon`` block.
mkdocstrings has no option for this."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc|const):`~?([^`]+)`")


def markdown(text: str) -> str:
    """``text`` with reStructuredText roles as inline code and literal-block colons single."""
    text = ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    text = re.sub(r"(\S)::$", r"\1:", text, flags=re.M)
    return _fence_doctests(text)


def _fence_doctests(text: str) -> str:
    """Each run of lines from a ``>>>`` line to the next blank line, fenced as ``pycon``."""
    out: list[str] = []
    inside = False
    for line in text.split("\n"):
        if not inside and line.lstrip().startswith(">>>"):
            out.append("```pycon")
            inside = True
        elif inside and not line.strip():
            out.append("```")
            inside = False
        out.append(line)
    if inside:
        out.append("```")
    return "\n".join(out)


class RstRoles(griffe.Extension):
    """Rewrites every docstring griffe loads (see :func:`markdown`)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
