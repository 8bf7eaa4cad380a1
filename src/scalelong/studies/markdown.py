"""Markdown tables, as every study report writes them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table: the header ``head``, its separator, then one line per row, cells as given."""
    return "\n".join([_line(head), "|---" * len(head) + "|", *(_line(row) for row in rows)])


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
