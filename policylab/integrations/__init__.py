"""Adapters that run policylab policies inside other serving engines (imported on demand only)."""
