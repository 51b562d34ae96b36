"""Backends in another process, in any language, over the tile-external protocol
(docs/external_protocol.md): ``ExternalDevice`` is the client behind ``external:COMMAND``, and
``server.serve`` (``python -m tile serve --target ID``) serves any device by the same protocol."""

from backends.external.client import ExternalDevice

__all__ = ["ExternalDevice"]
