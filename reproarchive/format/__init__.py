"""The byte layer: the container, its index encoding, digests and atomic writes. No torch here."""
