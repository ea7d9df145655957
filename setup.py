"""The packages, found rather than listed: every package under reproarchive/, and the CLI, which
lives in its own top-level folder (the library never needs click, and the tree shows it) but
installs as reproarchive.cli. setuptools' ``find`` names a package by its folder, so that one is
mapped here; everything else about the project is in pyproject.toml."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["reproarchive", "reproarchive.*"]),
                *(f"reproarchive.{p}" for p in find_packages(include=["cli", "cli.*"]))])
