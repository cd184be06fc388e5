"""The code blocks of the README and the docs pages, with the marker that says what is done with
each: every ```python and ```bash block is preceded by one of

    <!-- docs:test NAME -->   a test reads it with ``block(NAME)`` and runs it
    <!-- docs:file PATH -->   it is a copy of the file PATH, which the tests run
    <!-- docs:run -->         tests/test_docs.py runs it as it is
    <!-- docs:check -->       tests/test_docs.py parses every jaxnet command in it and checks its
                              experiment and keys (bash), without training
    <!-- docs:skip REASON --> not run, for the reason given

tests/test_docs.py enforces that every block has one.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^\s*<!-- docs:(test|file|run|check|skip)\b ?(.*?) ?-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclasses.dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    kind: str | None  # test, file, run, check, skip or None (unmarked)
    arg: str

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """The README and every page of the docs site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """Every fenced code block of ``page`` with the marker on the line before it."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        j = i + 1
        while not lines[j].strip().startswith("```"):
            j += 1
        code = "\n".join(line[len(indent) :] for line in lines[i + 1 : j]) + "\n"
        mark = MARKER.match(lines[i - 1]) if i else None
        out.append(Block(page, i + 1, lang, code, mark and mark.group(1), mark.group(2) if mark else ""))
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page)]


def block(name: str) -> str:
    """The code of the blocks marked ``docs:test NAME``; where several pages show it, all are the same."""
    codes = {b.code for b in all_blocks() if b.kind == "test" and b.arg == name}
    assert len(codes) == 1, f"docs:test {name}: {len(codes)} different blocks"
    return codes.pop()
