"""The binder's parts, one concern each; ``tile.bind`` (``bind``, ``bind_symbolic``) drives them."""
