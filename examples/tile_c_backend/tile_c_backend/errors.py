"""The errors this backend raises: both are ``tile.errors.TileBackendError``s naming the target."""

from __future__ import annotations

from tile.errors import TileBackendError


class UnsupportedConstruct(TileBackendError):
    """A Stripe construct the C generator does not translate, found while building (never while
    running): the message names the construct and the block it is in."""

    def __init__(self, construct: str, where: str, hint: str | None = None):
        super().__init__(
            f"c_cpu.0 cannot compile {construct} (in {where})",
            None,
            hint or "run the program on another target (llvm_cpu.0, interp), or extend tile_c_backend",
        )
        self.construct = construct


class CompileFailed(TileBackendError):
    """The system C compiler rejected the generated source (a bug of the generator, or a broken
    toolchain): the message holds the compiler's first lines of complaint."""
