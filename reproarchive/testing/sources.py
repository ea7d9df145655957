"""``SourceTests``: the contract every capture source meets, as a suite each source's tests subclass.

The model is zarr-python v3's ``StoreTests`` (``src/zarr/testing/store.py``): the base class
holds the checks, a subclass says how to run its source once (a module-scoped fixture, so a
real failure is captured once per source) and what that run must have left. The archives are
read through a side door (the format reader, ``machine_paths``), never through the source's own
report, so the report is checked against them rather than trusted.

A subclass sets ``source_record`` (the ``source`` variant its archives carry), ``failures``
(archives the run must write), ``stage`` (the failure they record), optionally ``filled``
(the record sections the source must fill), and provides a module-scoped ``captured`` fixture
returning a ``Captured``, with the ``PackReport`` the source itself returned for each archive
(``sources.source``: every source reports each archive it wrote). Ours:
``tests/sources/test_capture_backend.py``, ``test_capture_cli.py``, ``test_dump_import.py`` and
``test_trace_import.py``. Nothing is skipped.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

import pytest

from reproarchive.archive.checking import verify
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import Records
from reproarchive.package_version import __version__
from reproarchive.sources.pack_report import PackReport
from reproarchive.testing.machine_paths import machine_paths_in

__all__ = ["Captured", "SourceTests", "records_of"]


@dataclasses.dataclass
class Captured:
    """What one run of a source left: its archives, the reports the source returned for them
    (what its public function returns, or what its backend object lists), and folders of the
    run (cwd, dump or log folder) that no archive may name."""

    archives: list[Path]
    reports: list[PackReport]
    folders: tuple[Path, ...] = ()


def records_of(archive: Path) -> Records:
    with ContainerReader(archive) as reader:
        return reader.index.records


class SourceTests:
    """Subclass with ``source_record``, ``stage`` and a module-scoped ``captured`` fixture;
    name the subclass ``Test...``."""

    source_record: ClassVar[type]
    failures: ClassVar[int] = 1
    stage: ClassVar[str]
    filled: ClassVar[tuple[str, ...]] = ("backend", "config", "environment", "system", "failure", "source")

    @pytest.fixture(scope="module")
    def captured(self) -> Captured:
        raise NotImplementedError("a SourceTests subclass provides a module-scoped `captured` fixture")

    def test_one_archive_per_failure(self, captured: Captured):
        archives = [Path(a).resolve() for a in captured.archives]
        assert len(archives) == self.failures and len(set(archives)) == len(archives), archives
        assert all(a.is_file() for a in archives)

    def test_one_report_per_archive(self, captured: Captured):
        assert all(isinstance(r, PackReport) for r in captured.reports), captured.reports
        reported = sorted(Path(r.archive).resolve() for r in captured.reports)
        assert reported == sorted(Path(a).resolve() for a in captured.archives)

    def test_archives_verify(self, captured: Captured):
        for archive in captured.archives:
            verify(archive)

    def test_records_are_filled(self, captured: Captured):
        for archive in captured.archives:
            records = records_of(archive)
            missing = [name for name in self.filled if getattr(records, name) is None]
            assert not missing, f"{Path(archive).name}: the source left {', '.join(missing)} empty"
            assert isinstance(records.source, self.source_record), type(records.source).__name__
            assert records.created_by is not None and records.created_by.reproarchive == __version__

    def test_failure_is_recorded(self, captured: Captured):
        for archive in captured.archives:
            failure = records_of(archive).failure
            assert failure is not None and failure.stage == self.stage, failure
            assert failure.signature.startswith(f"{self.stage}|")

    def test_redaction_is_applied(self, captured: Captured):
        for archive in captured.archives:
            assert machine_paths_in(archive, *captured.folders) == []

    def test_report_says_what_the_archive_holds(self, captured: Captured):
        assert captured.reports, "the source reported none of its archives"
        for report in captured.reports:
            records = records_of(report.archive)
            assert report.size == Path(report.archive).stat().st_size
            assert report.backend == records.backend
            assert report.failure is not None and report.failure["stage"] == records.failure.stage
            assert report.failure["signature"] == records.failure.signature
            assert PackReport.from_plain(report.to_plain()) == report
