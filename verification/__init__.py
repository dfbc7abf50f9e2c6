"""Verification: evidence machinery that works on executor objects typed by the contracts' protocols."""
