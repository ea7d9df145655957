"""Run by another interpreter (``PY env_probe.py``, standard library only): what that environment
has -- its Python, torch and torch's git commit, and whether and where it has a reproarchive --
printed as one JSON line. Nothing here imports reproarchive's own modules."""

import importlib
import importlib.util
import json
import sys


def main() -> None:
    out = {"python": sys.version.split()[0], "executable": sys.executable}
    try:
        import torch

        out["torch"] = torch.__version__
        out["git_version"] = getattr(torch.version, "git_version", None)
    except Exception as exc:  # noqa: BLE001 - any failure to import torch is the answer
        out["torch_error"] = f"{type(exc).__name__}: {exc}"
    try:
        spec = importlib.util.find_spec("reproarchive")
        out["reproarchive"] = spec.origin if spec is not None else None
        if spec is not None:  # that environment's reproarchive, by name: not a dependency of this module
            found = importlib.import_module("reproarchive")
            out["reproarchive_version"] = getattr(found, "__version__", None)
    except Exception as exc:  # noqa: BLE001
        out["reproarchive_error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
