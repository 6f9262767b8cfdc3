"""The barriers' device code: ``.cuh`` files of this package (shipped as package data), read when a kernel is built.

A file starts with the ``#include "<file>.cuh"`` lines of the files it builds on, then its own code behind an
include guard; ``bench/probes/`` include the same files with nvcc. TVM pastes the source a
``T.cuda.func_call`` names once per function, not per file, so a kernel gets each file's dependencies
pasted in front of it, every part after a blank line (the guards keep repeated parts out).
"""

from __future__ import annotations

import functools
import re
from importlib import resources

_INCLUDE = re.compile(r'#include "(\w+\.cuh)"\n')


@functools.cache
def cuda_source(name: str) -> str:
    """What a kernel pastes for the device functions of ``name`` (``"sentinel.cuh"``): the files it includes,
    then its own code."""
    text = resources.files(__package__).joinpath(name).read_text()
    includes = []
    while found := _INCLUDE.match(text):
        includes.append(found[1])
        text = text[found.end() :]
    return "".join(cuda_source(dep) for dep in includes) + "\n" + text
