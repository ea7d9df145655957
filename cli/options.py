"""Options several commands share: ``--device`` (a device or a mapping), ``--max-memory``
(a size), and ``--import`` / ``--load-library`` (the user's own custom-op implementations)."""

from __future__ import annotations

import click


class DeviceOption(click.ParamType):
    """``--device``: ``cpu``, ``cuda:1``, or a mapping ``cuda:0=cpu,cuda:1=cpu``."""

    name = "DEV"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        text = value.strip()
        if not text:
            return None
        if "=" not in text:
            return text
        mapping: dict[str, str] = {}
        for item in text.split(","):
            src, sep, dst = item.partition("=")
            if not sep or not src.strip() or not dst.strip():
                self.fail(f"bad mapping {item.strip()!r}: write it as RECORDED=TARGET, e.g. cuda:0=cpu,cuda:1=cpu",
                          param, ctx)
            mapping[src.strip()] = dst.strip()
        return mapping


DEVICE = DeviceOption()


class SizeOption(click.ParamType):
    """``--max-memory``: bytes, or a number with K, M, G or T (powers of 1024): ``512M``, ``8G``."""

    name = "SIZE"
    _UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        text = str(value).strip().upper().removesuffix("IB").removesuffix("B")
        number, unit = (text[:-1], text[-1]) if text[-1:] in self._UNITS and text[-1:] else (text, "")
        try:
            size = float(number) * self._UNITS[unit]
        except ValueError:
            self.fail(f"{value!r} is not a size: write bytes or a number with K, M, G or T (e.g. 8G)", param, ctx)
        if size <= 0:
            self.fail(f"{value!r} must be positive", param, ctx)
        return int(size)


MAX_MEMORY = click.option(
    "--max-memory", type=SizeOption(), default=None, metavar="SIZE",
    help="Refuse an archive whose storages (real and generated) need more than SIZE (e.g. 8G) before "
         "allocating anything. Default: the memory available on this machine (and each device's free memory).")


def implementations(fn):
    """``--import MODULE`` / ``--load-library PATH``: the real implementation of a custom op the
    archive's graph calls, brought by the user (an archive never names what gets imported)."""
    fn = click.option("--load-library", "libraries", multiple=True, metavar="PATH",
                      type=click.Path(exists=True, dir_okay=False, resolve_path=True),
                      help="Load the shared library PATH (torch.ops.load_library) first: the real "
                           "implementation of a C++ custom op. Repeatable.")(fn)
    return click.option("--import", "imports", multiple=True, metavar="MODULE",
                        help="Import MODULE first: the real implementation of a Python custom op "
                             "(without it a custom op missing here replays from its recorded outputs). "
                             "Repeatable.")(fn)
