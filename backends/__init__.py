"""Compiled targets behind one HAL: the compile spine, the runner, the registry of devices, and one
subpackage per target or vendor (backends/README.md)."""
