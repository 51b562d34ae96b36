"""Stripe: the polyhedral IR (data model in ir.py)."""
