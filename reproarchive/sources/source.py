"""The capture ``Source`` protocol: what every way of turning a failure into archives declares.

A capture source finds a failing graph somewhere (a ``torch.compile`` backend in the failing
process, a repro script PyTorch dumped, a TORCH_TRACE log, a program run under ``capture --``),
and for each failure builds one ``archive.writing.Capture(graph, inputs, records)``; the one
writer, ``write_capture``, redacts the records and packs them. A source never calls ``pack``
or the redaction itself, and reports each archive it wrote as one ``sources.pack_report.PackReport``.

The sources, one module each (with the child process it runs, where it runs one):

    =========================================  ==================  ===============================================
    module                                     SOURCE_RECORD       entry point
    =========================================  ==================  ===============================================
    ``sources.capture.capture_backend``        ``CaptureSource``   ``reproarchive.capture(backend)``
    ``sources.dump.pack_child``                ``DumpSource``      ``reproarchive.pack_dump`` (``pack``)
    ``sources.trace.rebuild_child``            ``TraceSource``     ``reproarchive.pack_trace`` (``pack LOG``)
    ``sources.program.program_capture``        ``CaptureSource``   ``reproarchive.capture_program`` (``capture --``)
    =========================================  ==================  ===============================================

Adding a source (the recipe):

1. Declare its ``source`` record in ``format/schema/sections.py``: an open record with a ``TAG`` (its
   ``kind``), added to the ``Source`` union, with its fields in ``spec/FORMAT.md`` §8. That is a
   minor format version (§10): bump ``FORMAT_MINOR`` and run ``python -m reproarchive.spec_files
   --write`` (the version's schema file, grammar and golden vectors).
2. Write one module under ``sources/`` with ``SOURCE_RECORD`` and ``capture_of(...) ->
   Capture``, which fills every record it knows (backend, accuracy, config, environment,
   system, failure, source). Code that imports the user's script or replays a graph that may
   crash runs in a child process (``reproarchive.child``); the child sends its
   ``PackReport`` as plain data (``to_plain``), the parent reads it back (``from_plain``).
3. Write each archive with ``write_capture(capture_of(...), path, prefixes=...)``, passing the
   folders of the source (its dump, its log, the user's cwd) as redaction prefixes.
4. Give it one public function in ``reproarchive/__init__.py`` and one CLI command that prints
   its reports (``cli/text.pack_summary``, ``--json``: ``PackReport.to_json``).
5. Subclass ``reproarchive.testing.sources.SourceTests`` in its tests, with a module-scoped
   fixture that runs it once on a real failure (PyTorch's ``*_TESTING_ONLY`` backends are
   cheap) and hands over the archives and the reports the source returned: one archive per
   failure, one report per archive, records filled, redaction applied, failure recorded,
   ``verify`` passes, the report says what the archive holds. The in-process backend, which
   returns a compiled function rather than reports, lists them on itself (``reports``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from reproarchive.archive.writing import Capture

#: The modules that are capture sources (``tests/sources/test_source_protocol.py`` checks them).
SOURCE_MODULES = (
    "reproarchive.sources.capture.capture_backend",
    "reproarchive.sources.dump.pack_child",
    "reproarchive.sources.trace.rebuild_child",
    "reproarchive.sources.program.program_capture",
)


@runtime_checkable
class Source(Protocol):
    """A capture source module: the ``source`` record its archives carry, and the function
    that builds the ``Capture`` of one failure where the graph is."""

    SOURCE_RECORD: type

    def capture_of(self, *args: Any, **kwargs: Any) -> Capture: ...
