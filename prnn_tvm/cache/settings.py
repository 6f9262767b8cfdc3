"""Where the layer cache lives, whether it is used, and how large it may grow: read from the environment here
and nowhere else.

- ``PRNN_TVM_CACHE``: ``1`` (the default) uses the cache, ``0`` turns it off (``on``/``off``, ``true``/``false``,
  ``yes``/``no`` too);
- ``PRNN_TVM_CACHE_DIR``: the folder (default ``$XDG_CACHE_HOME/prnn-tvm``, else ``~/.cache/prnn-tvm``);
- ``PRNN_TVM_CACHE_MAX_MB``: the size it is trimmed to, least recently used entries first (default 2048).

Imports only the standard library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

ENABLED, FOLDER, MAX_MB = "PRNN_TVM_CACHE", "PRNN_TVM_CACHE_DIR", "PRNN_TVM_CACHE_MAX_MB"
DEFAULT_MAX_MB = 2048  # a CPU layer's library is ~0.1-0.5 MB, a CUDA one ~1 MB: thousands of layers
_WORDS = {"1": True, "on": True, "true": True, "yes": True, "0": False, "off": False, "false": False, "no": False}


@dataclass(frozen=True)
class CacheSettings:
    """The cache as the environment configures it: ``enabled``, its ``folder`` and ``max_bytes``."""

    enabled: bool
    folder: Path
    max_bytes: int


def settings(environ=None) -> CacheSettings:
    """The cache settings of ``environ`` (default ``os.environ``); ConfigError naming the variable when one is
    not understood."""
    env = os.environ if environ is None else environ
    word = env.get(ENABLED, "1").strip().lower()
    if word not in _WORDS:
        raise ConfigError(f"{ENABLED}={env[ENABLED]!r}: use 1 to cache compiled layers or 0 to compile every time")
    text = env.get(MAX_MB, str(DEFAULT_MAX_MB)).strip()
    try:
        max_mb = float(text)
    except ValueError:
        max_mb = -1.0
    if not max_mb > 0:
        raise ConfigError(
            f"{MAX_MB}={env[MAX_MB]!r}: the cache's size bound in MB must be a positive number "
            f"(default {DEFAULT_MAX_MB})"
        )
    return CacheSettings(_WORDS[word], folder(env), int(max_mb * (1 << 20)))


def folder(environ=None) -> Path:
    """The cache's folder: ``$PRNN_TVM_CACHE_DIR``, else ``$XDG_CACHE_HOME/prnn-tvm``, else ``~/.cache/prnn-tvm``."""
    env = os.environ if environ is None else environ
    if env.get(FOLDER):
        return Path(env[FOLDER]).expanduser()
    base = env.get("XDG_CACHE_HOME") or ""
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "prnn-tvm"
