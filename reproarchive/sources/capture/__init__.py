"""In-process capture: the capture backend, every call of a compiled graph guarded, the spool a
crash leaves, and capture on every rank of a job."""
