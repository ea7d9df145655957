"""Whole archives: pack, load (and read_input), verify and unpack, inspect."""
