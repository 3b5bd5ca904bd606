"""GPUs on paper: published memory and dense peak FLOP/s, so a run can be estimated for a GPU this machine lacks.

Memory is the board's (GiB as the vendor prints GB: NVIDIA's "80 GB" is 80 x 10^9 bytes for HBM3 parts and 80 GiB
for others; the table keeps the vendor's number in GB and converts). Dense bf16/fp16 peaks are the tensor-core
figures without 2:4 sparsity, from NVIDIA's datasheets (the same figures as `ortlab.flops.PEAK_TFLOPS`, which MFU
uses; this table adds memory and the source of each row):

- T4: NVIDIA T4 datasheet (16 GB GDDR6; 65 TFLOPS fp16 mixed precision; 8.1 TFLOPS fp32; no bf16 tensor cores)
- L4: NVIDIA L4 datasheet (24 GB; 242 TFLOPS fp16/bf16 with sparsity -> 121 dense; 30.3 fp32)
- A10G: AWS EC2 G5 (24 GB); the A10 datasheet's 125 TFLOPS bf16 dense is the A10's, the A10G is clocked lower:
  70 TFLOPS dense per AWS's G5 page ("up to 250 TFLOPS" per 8 GPUs of fp16 with sparsity is not used). 31.2 fp32.
- A100 40 GB / 80 GB: NVIDIA A100 datasheet (SXM: 312 TFLOPS bf16/fp16 dense, 19.5 fp32, 156 tf32)
- H100 SXM: NVIDIA H100 datasheet (80 GB; 989.4 TFLOPS bf16 dense, "1,979 with sparsity"; 67 fp32)
- H200: NVIDIA H200 datasheet (141 GB HBM3e; the same compute as H100 SXM: 989.4 bf16 dense)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gb: float  # as published (10^9 bytes)
    bf16_tflops: float | None  # dense, fp32 accumulate; None: no bf16 tensor cores
    fp16_tflops: float
    fp32_tflops: float
    source: str

    @property
    def memory_mb(self) -> float:
        return self.memory_gb * GB / 2**20

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s of the matmuls in `precision` (bf16 falls back to fp16's peak where the chip has none:
        a T4 runs bf16 by emulation, far slower; the estimate says so)."""
        value = {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops}.get(precision, self.fp32_tflops)
        return (value if value is not None else self.fp32_tflops) * 1e12


GPUS: tuple[Gpu, ...] = (
    Gpu("T4", 16, None, 65.0, 8.1, "NVIDIA T4 datasheet"),
    Gpu("L4", 24, 121.0, 121.0, 30.3, "NVIDIA L4 datasheet (242 with sparsity)"),
    Gpu("A10G", 24, 70.0, 70.0, 31.2, "AWS EC2 G5 instance page"),
    Gpu("A100 40GB", 40, 312.0, 312.0, 19.5, "NVIDIA A100 datasheet (SXM)"),
    Gpu("A100 80GB", 80, 312.0, 312.0, 19.5, "NVIDIA A100 datasheet (SXM)"),
    Gpu("H100 SXM", 80, 989.4, 989.4, 67.0, "NVIDIA H100 datasheet (1,979 with sparsity)"),
    Gpu("H200", 141, 989.4, 989.4, 67.0, "NVIDIA H200 datasheet"),
)


def gpu(name: str) -> Gpu:
    """The table's GPU for a name as users or torch write it ("h100", "NVIDIA A100-SXM4-80GB", "a10g")."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for g in GPUS:
        if re.sub(r"[^a-z0-9]", "", g.name.lower()) == key:
            return g
    for g in sorted(GPUS, key=lambda g: -len(g.name)):  # the most specific name first (A100 80GB before A100)
        model, _, size = g.name.lower().partition(" ")
        if model in key and (not size or re.sub(r"[^a-z0-9]", "", size) in key):
            return g
    for g in GPUS:
        if g.name.lower().split()[0] in key:
            return g
    names = ", ".join(g.name for g in GPUS)
    raise ValueError(f"{name!r} is not in ortlab's table of GPUs ({names}): estimate for one of them")
