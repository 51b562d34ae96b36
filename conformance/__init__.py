"""The conformance suite: Tile's targets against the reference interpreter (README.md)."""

from conformance.reproducible import pin as _pin

_pin()  # examples depend on the seed alone (conformance.reproducible)
