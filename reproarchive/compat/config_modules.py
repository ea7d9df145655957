"""What a torch config module is: ``torch.utils._config_module``.

torch's settings live in config modules (``torch._dynamo.config``, ``torch._inductor.config`` ...),
each an instance of ``ConfigModule``; an archive records every such module loaded in the capturing
process (``context.config``), learns which environment variables seed a setting from their entries
(``context.admission``), and, applying a recorded config, tells torch's "no environment override"
sentinel apart from a value (``_UNSET_SENTINEL``). Both are imported only when asked for: comparing
two recorded configs (``diff``) never imports torch.

Checked with 2.11.0, 2.13.0 and 2.15.0: both names are in all three; the module was reworked
between 2.13 and 2.15, but nothing used here changed. A torch without the module (older than this
project supports) has no config modules and no sentinel: the functions say so instead of raising.
"""

from __future__ import annotations

from typing import Any

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = (
    "torch.utils._config_module.ConfigModule",
    "torch.utils._config_module._UNSET_SENTINEL",
)


def config_module_type() -> type | None:
    """The class of torch's config modules; None on a torch without them."""
    try:
        from torch.utils._config_module import ConfigModule
    except ImportError:  # pragma: no cover - very old torch
        return None
    return ConfigModule


def unset_sentinel(default: Any) -> Any:
    """The value torch's config modules hold for "no environment override"; ``default`` on a
    torch without it (nothing is ever forced by the environment there)."""
    try:
        from torch.utils._config_module import _UNSET_SENTINEL
    except ImportError:  # pragma: no cover - older torch
        return default
    return _UNSET_SENTINEL
