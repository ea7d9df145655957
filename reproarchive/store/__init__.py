"""A team store of archives on object storage (spec/FORMAT.md §11): push, pull, list.

Layer: above ``archive`` (it reads and verifies archives), below the commands and the capture
sources (which push what they write). Modules: ``objects`` (the store's objects and their
checks), ``location`` (an fsspec URL and the operations on it), ``push``, ``pull``,
``listing``, ``access`` (``load``/``inspect``/``run`` that also take a store reference).
"""
