"""``capture --``: a whole program run under the crash guard and PyTorch's repro hooks, and the
shim that starts the guard in every Python process it launches."""
