"""The standalone ``repro.py`` export for bug reports."""
