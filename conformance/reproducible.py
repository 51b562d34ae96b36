"""The suite's examples depend on its seed alone, not on which modules a process has imported.

Hypothesis (6.13x and later) mixes into its draws constants it collects from every *local* module
in ``sys.modules`` (the checkout's own code: number and string literals), re-read whenever a module
is imported. Two processes with the same seed then draw different examples when they have imported
different modules (a pytest worker that ran the torch tests first, a Ray worker, a campaign chunk
without pytest), and any commit that adds a literal anywhere changes every derandomized run. The
shards of a run, a campaign's chunks and a failure's replay must draw the same examples, so the
conformance package pins that pool empty when it is imported. Hypothesis's own global constants
(edge values such as 0, -1, inf, nan) stay, and the strategies draw their distinguishing values on
purpose (``conformance.sweeps``).

This reaches into a private module; where a Hypothesis release no longer has it, ``pin()`` does
nothing and says so in ``PINNED``.
"""

from __future__ import annotations

PINNED = False


def pin() -> bool:
    """Make Hypothesis's pool of local constants empty for this process; True where it could."""
    global PINNED
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a Hypothesis without that module
        return False
    if not hasattr(providers, "_get_local_constants") or not hasattr(providers, "Constants"):
        return False  # pragma: no cover - a release that draws no local constants
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE.cache.clear()
    PINNED = True
    return True
