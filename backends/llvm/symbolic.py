"""The LLVM backend's name for ``backends.symbolic`` (shape-generic templates, shared with the C-like
targets since the eighth session): the same module, re-exported for the LLVM modules that import it
from here."""

from backends.symbolic import (  # noqa: F401 - re-exported
    LITERAL,
    Slot,
    SlotUsed,
    bind,
    canonical,
    erased,
    flat,
    is_slot,
    matches,
    slots,
    unify,
)
