"""A module an archive names as its Triton kernel's home: importing it leaves a marker file, so a
test can prove that nothing named by an archive is imported."""

import os
from pathlib import Path

Path(os.environ.get("REPROARCHIVE_TEST_MARKER", "triton-marker-imported")).write_text("imported\n")
