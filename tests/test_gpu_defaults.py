"""What 'auto' and the doctor choose on the GPUs notebook hosts lend (Colab's T4, L4 and A100; Kaggle's T4 and P100),
from each device's published properties: compute capability and bf16 support. torch.cuda is replaced by the
device's answers, so this runs on a CPU machine; the GPU path itself runs in tests/test_cuda_path.py where one is.

Sources: NVIDIA's CUDA GPUs table (compute capability: T4 7.5, V100 7.0, P100 6.0, A100 8.0, L4 8.9, H100 9.0);
bf16 tensor cores from Ampere (8.0) on, as `torch.cuda.is_bf16_supported()` reports them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortlab.accel import precision
from ortlab.accel.mix import resolve
from ortlab.spec import RunSpec
from ortlab.tune.precisionrace import candidate_precision

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

DEVICES = {
    # name: (capability, bf16 supported, what 'auto' trains in without a measurement, TF32)
    "Tesla T4": ((7, 5), False, "fp16", False),
    "Tesla V100-SXM2-16GB": ((7, 0), False, "fp16", False),
    "Tesla P100-PCIE-16GB": ((6, 0), False, "fp32", False),
    "NVIDIA L4": ((8, 9), True, "bf16", True),
    "NVIDIA A100-SXM4-40GB": ((8, 0), True, "bf16", True),
    "NVIDIA H100 80GB HBM3": ((9, 0), True, "bf16", True),
}


@pytest.fixture(params=list(DEVICES))
def device(request, monkeypatch):
    """torch.cuda answering as the named device would."""
    import torch

    name = request.param
    capability, bf16, _, _ = DEVICES[name]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *_, **__: bf16)
    _clear_caches()
    yield name
    _clear_caches()


def _clear_caches() -> None:
    for check in (precision.fp16_availability, precision.bf16_availability, precision.tf32_availability):
        getattr(check, "cache_clear", lambda: None)()


def test_auto_trains_in_16_bits_where_the_gpu_has_tensor_cores_for_them(device):
    _, _, expected, tf32 = DEVICES[device]
    accel = resolve(RunSpec().accel)
    assert accel.precision == expected, device
    assert accel.tf32 is tf32, "TF32 for fp32 matmuls where the GPU has it (Ampere and newer)"
    assert precision.tf32_availability().available is tf32


def test_the_doctor_and_the_precision_race_agree_with_the_default(device):
    """The race's candidate (what a measurement compares with fp32) is the default's 16-bit precision (on a P100,
    fp16 is still worth measuring); the doctor's bf16 row says why a T4 has none and what to use instead."""
    _, bf16, expected, _ = DEVICES[device]
    candidate, _why = candidate_precision()
    assert candidate == ("bf16" if bf16 else "fp16")
    assert expected in (candidate, "fp32")
    row = precision.bf16_availability()
    assert row.available is bf16
    if not bf16:
        assert row.remedy == "use fp16 on this GPU" and "needs Ampere" in row.reason
    assert precision.fp16_availability().available, "fp16 autocast is there on every CUDA device"


def test_a_cpu_still_trains_in_fp32_unless_a_measurement_says_otherwise(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve(RunSpec().accel).precision == "fp32"
    assert resolve(RunSpec().accel, {"precision": "bf16"}).precision == "bf16"


def test_a_measurement_overrides_the_gpu_default(device):
    assert resolve(RunSpec().accel, {"precision": "fp32"}).precision == "fp32"
    assert resolve(RunSpec(accel={"precision": "fp32"}).accel).precision == "fp32", "a pinned precision stays"


@pytest.mark.parametrize("notebook", ["01-quickstart.ipynb", "05-small-llm-lora.ipynb"])
def test_the_host_notebooks_leave_precision_to_auto(notebook):
    """Notebooks 01 and 05 are the ones opened on Colab: they must not pin a precision a T4 cannot run (bf16) or
    that wastes an A100 (fp32); 'auto' chooses per device, as tested above."""
    cells = json.loads((NOTEBOOKS / notebook).read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "precision" not in code and "bf16" not in code and "fp16" not in code
