"""Placeholder: filled by the issue that owns these commands."""
