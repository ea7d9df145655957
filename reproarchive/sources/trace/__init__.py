"""TORCH_TRACE logs and tlparse's output folders turned into archives without re-running the job."""
