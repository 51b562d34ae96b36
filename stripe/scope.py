"""What a statement of a block can name at one point, with the checks every executor makes.

A block's statements read refinements by name and pass scalars (``$x``) between them; each scalar
is assigned once, before any use. The Stripe interpreter and the LLVM and C-like code generators
all keep their views and scalars in a ``Scope``, and resolve a refinement's parent with
``missing_parent`` and ``check_access_rank``, so a malformed block fails the same way in each.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from stripe.ir import Block, Refinement, block_error

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


def missing_parent(block: Block, r: Refinement, hint: str) -> Exception:
    """The error for a refinement whose source the enclosing block does not have."""
    return block_error(
        block, f"refinement '{r.into}' refines '{r.source}', which the enclosing block does not have", hint
    )


def check_access_rank(block: Block, r: Refinement, rank: int) -> None:
    """A refinement has one access affine per dimension of its parent (of ``rank`` dimensions)."""
    if len(r.access) != rank:
        raise block_error(
            block,
            f"refinement '{r.into}' has {len(r.access)} access affines but '{r.source}' has rank {rank}",
            "give one access affine per dimension of the parent",
        )
