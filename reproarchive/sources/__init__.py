"""Where archives come from, one folder per route.

- ``capture/``: in the failing process, the capture backend (``reproarchive.capture``): every
  call of a compiled graph guarded, the spool a crash leaves, and the ranks of a job.
- ``program/``: ``capture --``, a whole program run under the crash guard and PyTorch's repro
  hooks (with the shim that starts the guard in every Python process it launches).
- ``dump/``: PyTorch's after_dynamo / after_aot repro dumps, read without running their data
  loaders' random fallbacks.
- ``trace/``: TORCH_TRACE logs and tlparse's output folders, packed without re-running the job.

At the root, what the routes share: the ``Source`` protocol (``source``), the report each writes
(``pack_report``), ``reproarchive.pack`` (``graph_pack``), the dump's graph module the dump and
trace imports both rebuild (``repro_module``), the replay that decides what an import failed
with (``import_replay``) and the scrubbing of the recording machine's paths (``path_scrub``).
"""
