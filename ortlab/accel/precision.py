"""Mixed precision: run matmuls in 16-bit floats, keep master weights in fp32.

- fp16 halves memory traffic and uses tensor cores on NVIDIA GPUs, but its narrow range under/overflows
  gradients, so it needs dynamic loss scaling (multiply the loss, unscale the gradients, skip steps that
  overflowed). Trainer does this with torch's GradScaler; it needs a CUDA device.
- bf16 has fp32's range (no loss scaling) and less precision. Fast on Ampere+ GPUs and on CPUs with bf16
  instructions (AVX512_BF16 or AMX); elsewhere it is emulated and much slower than fp32 (>10x seen on an
  EPYC without them).
"""

from __future__ import annotations

from functools import lru_cache

from ortlab.accel import Availability, package_version
from ortlab.cpuinfo import bf16_hardware


@lru_cache(maxsize=2)
def fp16_availability(probe: bool = False) -> Availability:
    if package_version("torch") is None:
        return Availability("fp16", False, "torch is not installed", "pip install torch")
    import torch

    if not torch.cuda.is_available():
        return Availability(
            "fp16",
            False,
            "fp16 needs a CUDA device (no CUDA device is visible to torch)",
            "use a machine with an NVIDIA GPU, or bf16 / fp32 on this machine",
        )
    name = torch.cuda.get_device_name(0)
    return Availability(
        "fp16",
        True,
        f"CUDA device {name}: fp16 autocast with dynamic loss scaling",
        "nothing to do",
        details={"device": name},
    )


@lru_cache(maxsize=2)
def bf16_availability(probe: bool = False) -> Availability:
    if package_version("torch") is None:
        return Availability("bf16", False, "torch is not installed", "pip install torch")
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        if torch.cuda.is_bf16_supported():
            return Availability(
                "bf16", True, f"CUDA device {name} supports bf16", "nothing to do", details={"device": name}
            )
        return Availability(
            "bf16",
            False,
            f"CUDA device {name} has no bf16 support (needs Ampere or newer)",
            "use fp16 on this GPU",
        )
    hw = bf16_hardware()
    if hw:
        return Availability(
            "bf16",
            True,
            f"CPU with bf16 instructions ({', '.join(hw)}): bf16 autocast",
            "nothing to do",
            details={"device": "cpu", "cpu_flags": hw},
        )
    return Availability(
        "bf16",
        True,
        "bf16 on this CPU has no hardware support (no avx512_bf16/amx_bf16) and is slow (>10x slower than fp32)",
        "train in fp32 on this CPU, or use a GPU with bf16 (Ampere or newer)",
        slow=True,
        details={"device": "cpu"},
    )


TF32_CAPABILITY = (8, 0)  # Ampere: the first NVIDIA GPUs whose tensor cores take TF32


@lru_cache(maxsize=2)
def tf32_availability(probe: bool = False) -> Availability:
    """TF32 matmuls: fp32 inputs rounded to a 10-bit mantissa inside the tensor cores, accumulated in fp32.

    Weights, activations and the optimizer stay fp32; only matmul/conv products lose precision (about bf16's
    on the inputs). On Ampere and newer it is ~8x the fp32 peak (A100: 156 vs 19.5 TFLOP/s). PyTorch leaves it
    off for matmuls by default; ortlab turns it on for 'auto' where the GPU has it, and records what it observed.
    """
    if package_version("torch") is None:
        return Availability("tf32", False, "torch is not installed", "pip install torch")
    import torch

    if not torch.cuda.is_available():
        return Availability(
            "tf32",
            False,
            "TF32 is a tensor-core mode of NVIDIA GPUs (Ampere or newer); no CUDA device is visible to torch",
            "nothing to do on this machine (fp32 matmuls are exact fp32 here); on a GPU, tf32 'auto' turns it on",
        )
    name = torch.cuda.get_device_name(0)
    capability = torch.cuda.get_device_capability(0)
    if tuple(capability) < TF32_CAPABILITY:
        return Availability(
            "tf32",
            False,
            f"CUDA device {name} (compute capability {capability[0]}.{capability[1]}) has no TF32 tensor cores "
            "(needs 8.0, Ampere, or newer)",
            "use fp16 for tensor-core speed on this GPU",
            details={"device": name, "capability": f"{capability[0]}.{capability[1]}"},
        )
    return Availability(
        "tf32",
        True,
        f"CUDA device {name} (compute capability {capability[0]}.{capability[1]}) runs fp32 matmuls in TF32",
        "nothing to do",
        details={"device": name, "capability": f"{capability[0]}.{capability[1]}"},
    )


FP16_TENSOR_CORES = (7, 0)  # Volta: the first NVIDIA GPUs with fp16 tensor cores (T4 is Turing, 7.5)


def cuda_default_precision(capability: tuple[int, int], bf16_supported: bool) -> str:
    """What 'auto' trains in on a CUDA device when nothing was measured for the run: bf16 where the GPU has it
    (Ampere and newer: A100, L4, A10G, H100; fp32's range, no loss scaling), else fp16 with loss scaling where it has
    fp16 tensor cores (V100, T4: 8x the fp32 matmul peak on a T4, 65 vs 8.1 TFLOP/s), else fp32 (Pascal and older,
    whose 16-bit matmuls are no faster). Unlike on a CPU, where bf16 is 0.8x or 1.6x fp32 depending on the model
    (so only a measurement may choose it), every tensor-core GPU trains a transformer faster in 16 bits; a
    measurement (`accel.tune`) still overrides this."""
    if bf16_supported and tuple(capability) >= TF32_CAPABILITY:
        return "bf16"
    if tuple(capability) >= FP16_TENSOR_CORES:
        return "fp16"
    return "fp32"


def cuda_precision_default() -> str | None:
    """`cuda_default_precision` for the first visible CUDA device, or None where torch sees none."""
    if package_version("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return cuda_default_precision(tuple(torch.cuda.get_device_capability(0)), bool(torch.cuda.is_bf16_supported()))


def tf32_state() -> dict[str, object]:
    """What torch will really do with fp32 matmuls now (observed, not configured).

    torch >= 2.9 has the `fp32_precision` settings ("tf32" / "ieee", "none": as the level above says). Once anything
    in the process set one (transformers' `tf32=True` does), reading a legacy flag (`allow_tf32`) raises
    (torch 2.11 on an H200: "you have used mix of the legacy and new APIs"), so the new settings are read first and
    a legacy flag that refuses to be read is recorded as None."""
    import torch

    state: dict[str, object] = {}
    matmul = torch.backends.cuda.matmul
    newer = getattr(matmul, "fp32_precision", None)
    if isinstance(newer, str):
        state["cuda_matmul_fp32_precision"] = newer
        state["fp32_precision"] = getattr(torch.backends, "fp32_precision", None)
    legacy = {
        "cuda_matmul_allow_tf32": lambda: bool(matmul.allow_tf32),
        "cudnn_allow_tf32": lambda: bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision,
    }
    for key, read in legacy.items():
        try:
            state[key] = read()
        except RuntimeError:  # the mixed-API refusal: the new settings above say it
            state[key] = None
    return state


def tf32_on(state: dict[str, object]) -> bool:
    """Do fp32 matmuls run in TF32, by the state `tf32_state()` observed?"""
    newer = state.get("cuda_matmul_fp32_precision")
    if newer == "none":  # as the global setting says
        newer = state.get("fp32_precision")
    return (
        newer == "tf32"
        or bool(state.get("cuda_matmul_allow_tf32"))
        or state.get("float32_matmul_precision") not in ("highest", None)
    )


class PrecisionWatch:
    """Watches one training step's forward: is autocast on, and in which dtype do the Linear layers compute?

    The run's precision is what the matmuls ran in, not what the configuration asked for: an accelerator that
    silently ignored bf16, or a DeepSpeed config that cast the model itself, shows here. Under ORTModule the
    Python forward runs only while ORT exports it, so what is observed there is the graph ORT then runs.
    """

    def __init__(self, model: object):
        import torch

        self.calls = 0
        self.dtypes: dict[str, int] = {}
        self.autocast: set[bool] = set()
        self._handles = [m.register_forward_hook(self._hook) for m in model.modules() if isinstance(m, torch.nn.Linear)]

    def _hook(self, module: object, inputs: object, output: object) -> None:
        import torch

        if not isinstance(output, torch.Tensor):
            return
        self.calls += 1
        name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(
            output.dtype, str(output.dtype)
        )
        self.dtypes[name] = self.dtypes.get(name, 0) + 1
        self.autocast.add(torch.is_autocast_enabled(output.device.type))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def observed(self) -> dict[str, object] | None:
        """What ran (None if no Linear forward was seen): the dtype most Linear outputs had, and autocast."""
        if not self.calls:
            return None
        return {
            "precision": max(self.dtypes, key=self.dtypes.__getitem__),
            "linear_outputs": dict(self.dtypes),
            "autocast": sorted(self.autocast),
        }
