"""DeepSpeed ZeRO stage 1: shard the optimizer state across data-parallel processes.

With plain data parallelism each of N processes keeps a full copy of the Adam moments (8 bytes per fp32
parameter, twice the model). ZeRO-1 gives each rank 1/N of them: a rank updates only its shard of the
parameters, then the updated shards are all-gathered. Memory per rank for optimizer state drops ~N-fold at
the cost of one all-gather per step; with one process it changes nothing but the code path.

DeepSpeed picks its communication backend from its accelerator: NCCL on CUDA, gloo on CPU (this is how ortlab
tests ZeRO-1 with two processes on a CPU machine).

`gather_floats` is how the trainer reads a number from every rank of the group (each rank's step time, and the
optimizer-state share ZeRO leaves it).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ortlab.accel import NOT_PROBED, Availability, package_version
from ortlab.netutil import LOOPBACK, LOOPBACK_INTERFACE, free_port


@lru_cache(maxsize=2)
def availability(probe: bool = False) -> Availability:
    """DeepSpeed installed and able to start here; `probe=True` imports it (seconds) and asks its accelerator."""
    name = "zero1"
    version = package_version("deepspeed")
    if version is None:
        return Availability(name, False, "deepspeed is not installed", "pip install 'ortlab[deepspeed]'")
    if package_version("torch") is None:
        return Availability(name, False, "torch is not installed", "pip install torch")
    if not probe:
        return Availability(
            name,
            True,
            f"deepspeed {version} installed{NOT_PROBED}",
            "nothing to do",
            details={"deepspeed": version},
        )
    try:
        import torch.distributed as dist
        from deepspeed.accelerator import get_accelerator

        accel = get_accelerator()
        backend = accel.communication_backend_name()
        backend_ok = {"nccl": dist.is_nccl_available, "gloo": dist.is_gloo_available}.get(backend, lambda: True)()
        details = {"deepspeed": version, "accelerator": accel.device_name(), "backend": backend}
    except Exception as e:
        return Availability(
            name,
            False,
            f"deepspeed {version} failed to start: {type(e).__name__}: {e}"[:400],
            "reinstall deepspeed for this torch (`pip install --force-reinstall deepspeed`)",
        )
    if not backend_ok:
        return Availability(
            name,
            False,
            f"torch.distributed has no {backend} backend",
            "install a torch build with the backend DeepSpeed needs",
            details=details,
        )
    return Availability(
        name,
        True,
        f"deepspeed {version} on its {details['accelerator']} accelerator, {backend} backend",
        "ZeRO-1 saves memory only with several processes (set processes > 1)",
        details=details,
    )


def deepspeed_config(stage: int = 1) -> dict:
    """A DeepSpeed config for ZeRO `stage` whose sizes come from the TrainingArguments ("auto").

    No "optimizer" section on purpose: the Trainer builds the optimizer (so `adamw_ort_fused` still applies)
    and DeepSpeed shards it. A DeepSpeed-side AdamW would JIT-compile its CPU op for minutes on first use.
    """
    return {
        "zero_optimization": {"stage": stage},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "fp16": {"enabled": "auto"},
        "bf16": {"enabled": "auto"},
        "zero_allow_untested_optimizer": True,
    }


def stage_of(config: dict | str | None) -> int:
    """The ZeRO stage of a DeepSpeed config (a dict or a JSON file path); 0 when there is none."""
    if config is None:
        return 0
    if isinstance(config, str):
        import json
        from pathlib import Path

        config = json.loads(Path(config).read_text())
    return int(config.get("zero_optimization", {}).get("stage", 0))


def ensure_process_group_env() -> bool:
    """DeepSpeed always starts torch.distributed. Launched without a launcher (a notebook, `python x.py`),
    there is no MASTER_ADDR/RANK/...: start a one-process group here. Returns True if it did.

    The group gets an in-memory store (`HashStore`), so nothing listens on the network for it (a TCPStore listens
    on every interface), and gloo is pinned to the loopback interface. The environment variables are set too,
    because DeepSpeed and Accelerate read them; ortlab's launcher does not pass them on to runs it starts.
    """
    import os

    if "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return False
    import torch
    import torch.distributed as dist

    port = free_port()
    os.environ.update(
        {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK_INTERFACE)
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return True


def gather_floats(values: list[float], device: Any) -> list[list[float]]:
    """`values` from every rank of the process group, by rank: one all-gather of a small float64 tensor (every rank
    must call it, with as many values). Without a process group, this process's own."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return [list(values)]
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [t.tolist() for t in every]
