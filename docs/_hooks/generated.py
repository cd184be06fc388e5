"""MkDocs hook: the pages' generated parts, made from the code when the site is built.

``<!-- generated: config-keys -->`` in a page becomes the table of every config key, from the
same schema ``jaxnet train EXP --show-config`` reads (:func:`jaxnet.config.keys`): the sections'
keys once, then each registered model family's ``model.*`` keys.
"""

from __future__ import annotations

import dataclasses
from typing import Any

MARK = "<!-- generated: config-keys -->"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _row(key: str, f: dataclasses.Field, default: Any) -> str:
    meta = f.metadata
    type_name = getattr(f.type, "__name__", str(f.type).replace("typing.", ""))
    limits = []
    if meta.get("choices"):
        limits.append("one of " + ", ".join(f"`{c}`" if c else "`''`" for c in meta["choices"]))
    if meta.get("aliases"):
        spelled = {k: v for k, v in meta["aliases"].items() if isinstance(k, str)}
        limits.append("also " + ", ".join(f"`{k}` (= `{v}`)" for k, v in spelled.items()))
    if meta.get("low") is not None:
        limits.append(f">= {meta['low']}")
    if meta.get("high") is not None:
        limits.append(f"<= {meta['high']}")
    shown = f"`{default!r}`" if default not in ("", None) else "`''`" if default == "" else "-"
    cells = [f'`{key}`', _cell(type_name), _cell(shown), _cell(meta.get('doc', '')), _cell('; '.join(limits))]
    return '| ' + ' | '.join(cells) + ' |'


def config_reference() -> str:
    """Markdown tables of every config key: type, default, meaning and allowed values."""
    from jaxnet.config import Config, keys, model_keys
    from jaxnet.models import base

    head = ["| key | type | default | what it does | allowed |", "|---|---|---|---|---|"]
    cfg = Config()
    lines = ["## Every run", "", *head]
    for key, f in keys(cfg).items():
        if key.startswith("model."):
            continue
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        lines.append(_row(key, f, value))
    for name, family in base.REGISTRY.items():
        model = family.config(name=name)
        lines += ["", f"## `model.name={name}`", "", f"Inputs: `{family.inputs}`.", "", *head]
        for key, f in model_keys(family.config).items():
            lines.append(_row(key, f, getattr(model, key.partition(".")[2])))
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARK in markdown:
        markdown = markdown.replace(MARK, config_reference())
    return markdown
