"""Triage: compare two archives (``diff``) and look at one (``view``), from their indexes."""
