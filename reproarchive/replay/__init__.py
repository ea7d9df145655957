"""Replaying an archive here: backends, accuracy, isolation, the outcome."""
