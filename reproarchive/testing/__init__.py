"""The conformance suites: what a store backend, a capture source or a device runtime must do, as tests.

Why. reproarchive has three seams a third party may fill from another package: a kind of
storage (``store.backend.Store``), a way of turning a failure into archives (a capture source,
``sources.source``) and a device type (``codec.device_runtime.DeviceRuntime``). Each interface
lists its promises in its docstring; the suite here checks every one of them, and ours pass the
same suites (``tests/store``, ``tests/sources``, ``tests/codec/test_device_runtime.py``). A
third party proves that its implementation keeps the interface's promises by subclassing the
suite, as zarr-python's ``zarr.testing.store.StoreTests`` is subclassed by other stores.

How. Subclass the suite in a test module, name the subclass ``Test...`` so pytest collects it,
provide what the suite asks for, and run pytest:

* ``stores.StoreTests``: a ``store`` fixture that opens an empty store of the backend, and a
  side door, ``side_put``/``side_get``, that writes and reads its objects without the class
  under test. A capability the backend does not claim is checked to be refused, not skipped.
* ``sources.SourceTests``: ``source_record``, ``stage`` (and ``failures``, ``filled`` where
  they differ), and a module-scoped ``captured`` fixture that runs the source once on a real
  failure and returns a ``sources.Captured``: the archives, the source's own ``PackReport``
  of each, the folders no archive may name.
* ``device_runtimes.RuntimeTests``: ``device``, the device the runtime serves (``"xpu:0"``).
  Checks that need the device skip, saying so, on a machine without it; the runtime is then
  checked to say it has none.

Each module documents its suite; docs/testing.md has the three together.

The suites need pytest, a test extra: only test code imports this package, and nothing in the
library or the CLI does (``tests/test_layers.py`` checks both).
"""
