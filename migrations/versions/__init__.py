"""Revisions of the scalewatch store, oldest first by ``down_revision``."""
