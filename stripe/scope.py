"""What a statement of a block can name at one point, with the checks every executor makes.

A block's statements read refinements by name and pass scalars (``$x``) between them; each scalar
is assigned once, before any use. The Stripe interpreter and the LLVM and C-like code generators
all keep their views and scalars in a ``Scope``, so a malformed block fails the same way in each.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from stripe.ir import Block, block_error

V = TypeVar("V")  # an executor's view of a refinement
S = TypeVar("S")  # an executor's scalar value


class Scope(Generic[V, S]):
    def __init__(self, block: Block, views: dict[str, V]):
        self.block = block
        self.views = views
        self.scalars: dict[str, S] = {}

    def ref(self, name: str, stmt) -> V:
        """The refinement ``stmt`` names."""
        if name not in self.views:
            raise block_error(
                self.block,
                f"{type(stmt).__name__} names refinement '{name}', which the block does not have",
                "add the refinement to the block",
            )
        return self.views[name]

    def get(self, name: str) -> S:
        if name not in self.scalars:
            raise block_error(
                self.block, f"uses scalar '{name}' before it is assigned", "assign each scalar first"
            )
        return self.scalars[name]

    def put(self, name: str, value: S) -> None:
        if name in self.scalars:
            raise block_error(self.block, f"assigns scalar '{name}' twice", "scalars are assigned once")
        self.scalars[name] = value
