"""Shipping an artifact: the device bundle and the runtime wheel."""
