"""Where archives come from: the capture backend, program capture, PyTorch dump import."""
