"""Exceptions raised by prnn-tvm.

Every error a user can cause (a cell the compiler cannot map, a schedule config that
does not fit the GPU, inputs of the wrong shape) is one of these, with a message that
names the offending piece and says what would be accepted.
"""


class PrnnError(Exception):
    """Base class of every error prnn-tvm raises on purpose."""


class CellError(PrnnError):
    """The cell definition cannot be compiled to a persistent kernel.

    ``stage`` names the TE stage (or declared tensor) at fault, when there is one.
    """

    def __init__(self, message: str, stage: str | None = None):
        super().__init__(f"stage '{stage}': {message}" if stage else message)
        self.stage = stage


class ConfigError(PrnnError):
    """A schedule config was rejected before building (registers, shared memory, grid)."""


class InputError(PrnnError, ValueError):
    """Arguments of a compiled layer call have the wrong shape, dtype or device."""


class LaunchError(PrnnError):
    """A kernel launch was refused before it started (for example a grid too large to be co-resident)."""


class BarrierTimeout(PrnnError):
    """A grid barrier wait gave up: some block never arrived. The layer's outputs are invalid."""


class SessionError(PrnnError):
    """A resident session cannot start (its SMs are not free), was closed, or timed out (its states are lost)."""


class ExportError(PrnnError):
    """A layer cannot be exported (for example a CUDA layer whose kernels nvcc cannot compile here)."""


class LoadError(PrnnError):
    """An exported library cannot be used here: not a prnn-tvm library, damaged, or built for another GPU."""


class UnsupportedError(PrnnError, RuntimeError):
    """Something prnn-tvm does not do, asked for where going on would give a wrong answer or a confusing
    failure: a second derivative through a kernel, tracing a module with ``torch.jit``, pickling a layer."""
