"""What a compile produced, in numbers: the report the CLI prints and tests inspect."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field


class ConfigOrigin(str, enum.Enum):
    """Where a layer's config came from (``prnn_tvm.choice`` decides)."""

    USER = "user"  # passed to compile_cell
    TUNED = "tuned"  # the best tuning record for this cell, shapes and GPU
    DEFAULT = "default"  # the template's untuned choice
    NONE = "none"  # the template has no knobs


@dataclass(frozen=True)
class CompileReport:
    """Cell, shapes, the schedule used and where its config came from, and ptxas's figures.

    ``config_origin`` says where the config came from and ``config_detail`` says it in
    words, with the reason (``"tuned: 2.81 us/step measured on ..."``, ``"default: no
    tuning record ..."``). ``registers`` and the spill/stack figures come from ptxas for CUDA builds (None on the
    CPU, or when nvcc is unavailable: ``ptxas_note`` says why); they are the recurrent kernel's, and
    ``projection_ptxas`` sums up the input projection's kernel in words. ``weight_register_bytes`` and
    ``weight_smem_bytes`` say where a CTA keeps its recurrent weights, ``weight_l2_bytes`` what it reads from global
memory (served by L2) every step instead (None for a template without a geometry).
    """

    cell: str
    fingerprint: str
    batch: int
    hidden: int
    input_size: int
    seq_len: int | None
    dtype: str
    target: str
    template: str
    config: dict = field(default_factory=dict)
    config_origin: ConfigOrigin = ConfigOrigin.NONE
    config_detail: str = "none"
    config_passed_over: tuple = ()  # spill bytes of each ranked default built before this config and dropped
    ctas: int | None = None
    threads: int | None = None
    dynamic_smem_bytes: int | None = None
    registers: int | None = None
    stack_bytes: int | None = None
    spill_store_bytes: int | None = None
    spill_load_bytes: int | None = None
    static_smem_bytes: int | None = None
    weight_register_bytes: int | None = None  # recurrent weights per CTA held in registers (32-bit words)
    weight_smem_bytes: int | None = None  # recurrent weights per CTA in shared memory (the weight tiers)
    weight_l2_bytes: int | None = None  # recurrent weights per CTA read from global memory (L2) every step
    ptxas_note: str = ""
    projection_ptxas: str = ""

    @property
    def spill_bytes(self) -> int | None:
        if self.spill_store_bytes is None:
            return None
        return self.spill_store_bytes + self.spill_load_bytes

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CompileReport:
        """The report :meth:`as_dict` gave (after a JSON round trip)."""
        return cls(
            **{
                **d,
                "config_origin": ConfigOrigin(d["config_origin"]),
                "config_passed_over": tuple(d["config_passed_over"]),
            }
        )

    def format(self) -> str:
        lines = [
            f"cell        {self.cell} (math hash {self.fingerprint})",
            f"shapes      batch={self.batch} hidden={self.hidden} input={self.input_size} "
            f"seq_len={self.seq_len if self.seq_len is not None else 'any'} dtype={self.dtype}",
            f"target      {self.target}",
            f"schedule    {self.template}",
        ]
        if self.config:
            knobs = " ".join(f"{k}={v}" for k, v in self.config.items())
            lines.append(f"config      {knobs} ({self.config_detail})")
        if self.ctas is not None:
            lines.append(
                f"grid        {self.ctas} CTAs x {self.threads} threads, "
                f"{self.dynamic_smem_bytes} B dynamic shared memory per CTA"
            )
        if self.weight_register_bytes is not None:
            lines.append(f"weights     {self.weight_register_bytes} B in registers, {self.weight_smem_bytes or 0} B in "
                         f"shared memory, {self.weight_l2_bytes or 0} B in global memory (L2) per CTA")
        if self.registers is not None:
            lines.append(
                f"ptxas       {self.registers} registers/thread, {self.spill_store_bytes} B spill stores, "
                f"{self.spill_load_bytes} B spill loads, {self.stack_bytes} B stack, "
                f"{self.static_smem_bytes} B static shared memory"
            )
        elif self.ptxas_note:
            lines.append(f"ptxas       {self.ptxas_note}")
        if self.projection_ptxas:
            lines.append(f"projection  {self.projection_ptxas}")
        return "\n".join(lines)
