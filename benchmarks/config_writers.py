"""Which torch config settings make a compile write files (an audit of spec §9's config filter).

For every boolean setting of the compiler config modules, flip it, compile a small graph with
inductor through ``torch.compile`` in a fresh working folder, and list what appeared: in the
working folder, in torch's debug folder, and in the temp folder outside inductor's own cache.
Then say which of the writers ``reproarchive.context.admission`` refuses and which it would
apply (those are only safe because ``run`` compiles in a private folder).

    python benchmarks/config_writers.py [--limit N] [--json OUT]

Slow (one inductor compile per setting); not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _snapshot(root: Path) -> set[str]:
    if not root.exists():
        return set()
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--json", dest="json_out")
    opts = parser.parse_args(argv)

    import torch
    import torch._dynamo.config
    import torch._inductor.config

    from reproarchive.context.admission import setting_problem
    from reproarchive.context.config import _config_modules

    def fn(x):
        return (x.sin() + x.cos()).relu().sum(0)

    tmp_root = Path(tempfile.gettempdir())
    found: list[dict] = []
    keys = []
    for mod_name, mod in _config_modules().items():
        for key, entry in sorted(mod._config.items()):
            if isinstance(entry.default, bool) and getattr(entry, "alias", None) is None:
                keys.append((mod_name, mod, key, entry.default))
    if opts.limit:
        keys = keys[: opts.limit]
    started = time.monotonic()
    for i, (mod_name, mod, key, default) in enumerate(keys):
        work = Path(tempfile.mkdtemp(prefix="cfgaudit-"))
        debug = work / "debug"
        old = os.getcwd()
        before_tmp = {p.name for p in tmp_root.iterdir()}
        error = None
        try:
            os.chdir(work)
            torch._dynamo.reset()
            with torch._dynamo.config.patch(debug_dir_root=str(debug)), \
                    torch._inductor.config.patch(fx_graph_cache=False), mod.patch(**{key: not default}):
                torch.compile(fn, backend="inductor")(torch.randn(4, 4))
        except Exception as exc:  # noqa: BLE001 - a setting that breaks compiling is still audited
            error = f"{type(exc).__name__}: {str(exc)[:120]}"
        finally:
            os.chdir(old)
        written = sorted(p for p in _snapshot(work) if not p.startswith("debug"))
        debug_written = sorted(_snapshot(debug))
        new_tmp = sorted(n for n in {p.name for p in tmp_root.iterdir()} - before_tmp
                         if not n.startswith(("cfgaudit-", "torchinductor_", "tmp")))
        if written or debug_written or new_tmp:
            verdict = setting_problem(key, not default, default)
            found.append({"setting": f"{mod_name}.{key}", "value": not default, "cwd": written[:5],
                          "debug_dir": debug_written[:5], "tmp": new_tmp[:5], "refused": verdict, "error": error})
            print(json.dumps(found[-1]), flush=True)
        print(f"[{i + 1}/{len(keys)}] {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    applied = [f["setting"] for f in found if f["refused"] is None]
    print(f"{len(keys)} boolean settings; {len(found)} write files; applied by the filter anyway: {applied}")
    if opts.json_out:
        Path(opts.json_out).write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
