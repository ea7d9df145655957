"""The format's name and version (spec §10): what the layout member, the footer and the index
carry. A change to any schema record needs the bump ``schema_check`` names."""

from __future__ import annotations

FORMAT_NAME = "reproarchive"
FORMAT_MAJOR = 1
FORMAT_MINOR = 7
FORMAT_VERSION = f"{FORMAT_MAJOR}.{FORMAT_MINOR}"
