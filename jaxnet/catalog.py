"""Experiment files on disk: where names are looked up, and what each file's docstring says.

Read without running the files and without JAX, so ``jaxnet list`` answers at once. An
experiment's docstring starts with a one-line description, then ``Field:`` lines (``Command:``,
``Result:``, ``Time:``), each continued on lines indented under its text::

    A small ConvNet on Fashion-MNIST: the default experiment.

    Command:  jaxnet train cnn_fashion_mnist
    Result:   92.14 % test accuracy
    Time:     99 s on a 2-core CPU, start to finish

>>> fields("Mine.\\n\\nResult:   0.9 accuracy;\\n          after 5 steps\\nTime:     2 s\\n")["result"]
'0.9 accuracy; after 5 steps'
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

#: Longest text of a field that ``jaxnet list`` prints on one line.
WIDTH = 110


def experiment_dirs() -> list[Path]:
    """Where experiment names are looked up, in order.

    ``$JAXNET_EXPERIMENTS`` (colon-separated), ``./experiments``, then the experiments/ folder
    next to the installed package (a source checkout).
    """
    dirs = [Path(p) for p in os.environ.get("JAXNET_EXPERIMENTS", "").split(os.pathsep) if p]
    dirs += [Path.cwd() / "experiments", Path(__file__).resolve().parents[1] / "experiments"]
    unique: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [u.resolve() for u in unique]:
            unique.append(d)
    return unique


def experiment_files() -> dict[str, Path]:
    """Each experiment's name and file; the first directory of :func:`experiment_dirs` holding a
    name wins, as when it is loaded."""
    files: dict[str, Path] = {}
    for d in experiment_dirs():
        for path in sorted(d.glob("*.py")):
            if not path.stem.startswith("_"):
                files.setdefault(path.stem, path)
    return dict(sorted(files.items()))


def list_experiments() -> list[str]:
    """Names of the experiments found in :func:`experiment_dirs`."""
    return list(experiment_files())


def fields(docstring: str) -> dict[str, str]:
    """An experiment docstring's parts: ``description`` (its first paragraph) and each ``Field:``
    (lower-cased name), its continuation lines joined with single spaces."""
    lines = docstring.strip().splitlines()
    first = lines[: lines.index("")] if "" in lines else lines
    found = {"description": " ".join(line.strip() for line in first)} if lines else {}
    name = None
    for line in lines[len(first) :]:
        head = re.match(r"([A-Z][A-Za-z ]*):\s+(\S.*)", line)
        if head:
            name = head.group(1).lower()
            found[name] = head.group(2).strip()
        elif name and line.startswith(" ") and line.strip():
            found[name] += " " + line.strip()
        else:
            name = None
    return found


def one_line(text: str, width: int = WIDTH) -> str:
    """``text`` shortened for a listing: references to result files dropped, then cut before the
    last ``;`` that fits (else the last parenthesis or comma; else at ``width``, with ``...``)."""
    text = re.sub(r"\s*\((?:see )?benchmarks/[^)]*\)", "", text).strip().rstrip(",;")
    if len(text) <= width:
        return text
    for mark in ("; ", " (", ", "):  # a parenthesis left open is no place to stop
        cut = text.rfind(mark, 0, width)
        while cut > 0 and text.count("(", 0, cut) != text.count(")", 0, cut):
            cut = text.rfind(mark, 0, cut)
        if cut > 0:
            return text[:cut]
    return text[: width - 3].rstrip() + "..."


def summary(path: Path) -> dict[str, str]:
    """The description, result and time of the experiment file ``path``, from its docstring
    (``{}`` for a file without one or that does not parse)."""
    try:
        docstring = ast.get_docstring(ast.parse(path.read_text(), str(path)))
    except (OSError, SyntaxError, ValueError):
        return {}
    return fields(docstring) if docstring else {}


def listing() -> str:
    """What ``jaxnet list`` prints: each experiment's name and one-line description, then its
    result and time."""
    files = experiment_files()
    if not files:
        return "no experiments found (looked in ./experiments and $JAXNET_EXPERIMENTS)"
    width = max(len(name) for name in files)
    out = []
    for name, path in files.items():
        about = summary(path)
        out.append(f"{name:<{width}}  {one_line(about.get('description', ''))}".rstrip())
        for key in ("result", "time"):
            if about.get(key):
                out.append(f"{'':<{width}}    {key + ':':<8}{one_line(about[key])}")
    return "\n".join(out)
