"""The models of the step-latency benchmark (``prnn-tvm bench --step-latency``): LSTMs served one timestep per call.

Pure: the command line reads the defaults for its help, and checks ``--model`` values, without PyTorch or a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError

MIN_STEPS = 100  # a p99 over fewer steps is a maximum
DEFAULT_STEPS = 10_000
DEFAULT_CHAIN = 100  # dependent steps in one CUDA graph
CHAIN_REPLAYS = 50  # replays of that graph: the chain modes' samples
DTYPES = ("float32", "float16")  # the host modes pass NumPy arrays, which have no bfloat16


@dataclass(frozen=True)
class StepModel:
    """A ``torch.nn.LSTM`` of ``layers`` x ``hidden`` (input size ``hidden``) stepped at ``batch`` in ``dtype``; its
    session runs the deep stack (:attr:`cell`), each layer reading the one below's new output in the same step."""

    layers: int
    hidden: int
    batch: int
    dtype: str

    @property
    def name(self) -> str:
        return f"LSTM {self.layers}x{self.hidden} B={self.batch} {self.dtype}"

    @property
    def cell(self) -> str:
        return f"lstm_d{self.layers}" if self.layers > 1 else "lstm"

    def as_dict(self) -> dict:
        return {
            "model": self.name,
            "layers": self.layers,
            "hidden": self.hidden,
            "batch": self.batch,
            "dtype": self.dtype,
        }


DEFAULT_MODELS = (  # issue 47's rows: market models at batch 1, and an RNN-T prediction network
    StepModel(2, 128, 1, "float32"),
    StepModel(3, 480, 1, "float32"),
    StepModel(3, 960, 1, "float16"),
    StepModel(3, 960, 1, "float32"),
    StepModel(1, 640, 8, "float16"),
)


def models_from(given: list | None) -> tuple[StepModel, ...]:
    """The models of ``--model LAYERS HIDDEN BATCH DTYPE`` (each a list of those four words), or the defaults for
    None; InputError naming the bad value and what is accepted."""
    if not given:
        return DEFAULT_MODELS
    found = []
    for words in given:
        if len(words) != 4:
            raise InputError(f"--model takes LAYERS HIDDEN BATCH DTYPE, got {' '.join(map(str, words))}")
        *sizes, dtype = words
        numbers = []
        for what, text in zip(("LAYERS", "HIDDEN", "BATCH"), sizes):
            if not str(text).isdigit() or int(text) < 1:
                raise InputError(f"--model {' '.join(words)}: {what} must be a positive integer, got {text!r}")
            numbers.append(int(text))
        if dtype not in DTYPES:
            raise InputError(
                f"--model {' '.join(words)}: DTYPE must be one of {', '.join(DTYPES)} (the host modes pass NumPy "
                f"arrays, which have no bfloat16), got {dtype!r}"
            )
        found.append(StepModel(*numbers, dtype))
    return tuple(dict.fromkeys(found))


def check_steps(steps: int) -> int:
    """``steps`` if a p99 over them means something, else InputError."""
    if steps < MIN_STEPS:
        raise InputError(f"--steps must be at least {MIN_STEPS} (a p99 over fewer steps is their maximum), got {steps}")
    return steps
