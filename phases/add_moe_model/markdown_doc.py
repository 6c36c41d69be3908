"""Idempotent edits of a markdown document made of ``##`` sections, tables and ``###`` subsections.

Rows are found by the text of one column, subsections by their heading line, so running an
edit twice leaves one copy. Pure text, no markdown library: the document's own layout is
kept byte for byte outside the edited lines.
"""

from __future__ import annotations


def _section_bounds(lines: list[str], section: str) -> tuple[int, int]:
    start = next((i for i, line in enumerate(lines) if line.strip() == f"## {section}"), None)
    if start is None:
        raise ValueError(f"section '## {section}' not found; the document must keep its four sections")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return start, end


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def upsert_table_row(text: str, *, section: str, key_column: int, key: str, row: str) -> str:
    """Replace the table row whose ``key_column`` equals ``key`` in ``section``, or append it."""
    lines = text.split("\n")
    start, end = _section_bounds(lines, section)
    table = [i for i in range(start, end) if lines[i].lstrip().startswith("|")]
    if len(table) < 2:
        raise ValueError(f"section '## {section}' has no table with a header")
    for i in table[2:]:
        cells = _cells(lines[i])
        if len(cells) > key_column and cells[key_column] == key:
            lines[i] = row
            return "\n".join(lines)
    lines.insert(table[-1] + 1, row)
    return "\n".join(lines)


def upsert_subsection(text: str, *, section: str, heading: str, body: str) -> str:
    """Replace ``heading`` and its body inside ``section``, or append it at the section's end."""
    lines = text.split("\n")
    start, end = _section_bounds(lines, section)
    block = [heading, "", *body.rstrip("\n").split("\n")]
    at = next((i for i in range(start, end) if lines[i].strip() == heading), None)
    if at is None:
        insert = end
        while insert > start + 1 and lines[insert - 1].strip() == "":
            insert -= 1
        new = ([""] if lines[insert - 1].strip() else []) + block
        if insert >= len(lines) or lines[insert].strip():
            new.append("")
        lines[insert:insert] = new
        return "\n".join(lines)
    if at + 1 < end and lines[at + 1].strip():  # the document's own style: body right under the heading
        block.remove("")
    stop = next((i for i in range(at + 1, end) if lines[i].startswith("### ")), end)
    blanks = 0
    while stop - blanks - 1 > at and lines[stop - blanks - 1].strip() == "":
        blanks += 1
    lines[at:stop] = block + [""] * blanks
    return "\n".join(lines)


def table(text: str, *, section: str) -> tuple[list[str], list[list[str]]]:
    """Header cells and body rows (as cells) of the first table in ``section``."""
    lines = text.split("\n")
    start, end = _section_bounds(lines, section)
    rows = [_cells(lines[i]) for i in range(start, end) if lines[i].lstrip().startswith("|")]
    return (rows[0], rows[2:]) if len(rows) >= 2 else ([], [])


def find_heading(text: str, *, section: str, suffix: str) -> str | None:
    """The one ``###`` heading of ``section`` that ends with ``suffix`` (None when none or several)."""
    lines = text.split("\n")
    start, end = _section_bounds(lines, section)
    found = [lines[i].strip() for i in range(start, end)
             if lines[i].startswith("### ") and lines[i].strip().endswith(suffix)]
    return found[0] if len(found) == 1 else None


def has_section(text: str, section: str) -> bool:
    return any(line.strip() == f"## {section}" for line in text.split("\n"))


def append_section(text: str, section: str) -> str:
    """``text`` with an empty ``## section`` at its end (for a subsection to go into at once)."""
    return text.rstrip("\n") + f"\n\n## {section}\n"


def remove_subsection(text: str, *, section: str, heading: str) -> str:
    """``text`` without ``heading`` and its body inside ``section`` (unchanged when it has none)."""
    lines = text.split("\n")
    start, end = _section_bounds(lines, section)
    at = next((i for i in range(start, end) if lines[i].strip() == heading), None)
    if at is None:
        return text
    stop = next((i for i in range(at + 1, end) if lines[i].startswith("### ")), end)
    del lines[at:stop]
    return "\n".join(lines)


def drop_empty_section(text: str, section: str) -> str:
    """``text`` without ``## section`` when nothing but blank lines sits under it: no heading without content."""
    lines = text.split("\n")
    start, end = _section_bounds(lines, section)
    if any(line.strip() for line in lines[start + 1:end]):
        return text
    if end < len(lines):
        del lines[start:end]
        return "\n".join(lines)
    return "\n".join(lines[:start]).rstrip("\n") + "\n"
