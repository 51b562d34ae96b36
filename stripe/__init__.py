"""Stripe: the polyhedral IR (placeholder until its issue lands)."""
