"""Compiled targets behind one HAL (placeholder until its issue lands)."""
