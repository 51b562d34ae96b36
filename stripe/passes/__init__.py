"""Stripe → Stripe optimization passes, one module per pass, chosen by a target's config.

Importing this package imports every module in it, and so registers every vendor-neutral pass
(``PASSES``); a vendor's own passes live in its backend package and register when a config that
names them in ``"pass_modules"`` is loaded (``stripe.config``). ``optimize`` runs a config's
list. The modules that are not passes: ``registry``, ``pipeline``, ``rewrite`` (the tree-walking
helper every pass uses).
"""

import importlib
import pkgutil

from stripe.passes.pipeline import optimize, steps
from stripe.passes.registry import PASSES, PassInfo, register

for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["PASSES", "PassInfo", "optimize", "register", "steps"]
