"""Tile text from the syntax tree: ``parse(format_program(p)) == p``.

The printer is part of the syntax tree's module (``tile.ast``: a ``Program`` prints itself, so its
text form lives with its nodes); these are its names, as every stage after the tree imports them.
"""

from tile.ast import format_combination, format_expr, format_program, format_ref, format_statement

__all__ = ["format_combination", "format_expr", "format_program", "format_ref", "format_statement"]
