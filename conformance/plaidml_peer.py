"""PlaidML 0.7.0 as the differential peer: the worker of ``backends.plaidml.worker``, re-exported.

The peer tests (``test_plaidml_peer*.py``) call PlaidML through ``PlaidML.run`` exactly as it is,
with no rewriting of the program (unlike the ``plaidml.llvm_cpu.0`` device), so that they observe
PlaidML's own behaviour.
"""

from backends.plaidml.worker import ENV, INSTALL, PeerError, PlaidML, output_names, unavailable

__all__ = ["ENV", "INSTALL", "PeerError", "PlaidML", "output_names", "unavailable"]
