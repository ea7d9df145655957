"""A team store of archives on object storage (spec/FORMAT.md §11): push, pull, list.

Layer: above ``archive`` (it reads and verifies archives), below the commands and the capture
sources (which push what they write). Modules: ``objects`` (the store's objects and their
checks), ``backend`` (the ``Store`` interface every kind of storage implements, and the recipe
for adding one), ``location`` (URLs, and ``FsspecStore``: every fsspec filesystem), ``push``,
``pull``, ``listing``, ``access`` (``load``/``inspect``/``run`` that also take a store
reference). The suite each backend's tests subclass, ``StoreTests``, is in
``reproarchive.testing.stores``.
"""
