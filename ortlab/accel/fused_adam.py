"""Fused AdamW: one kernel updates every parameter, instead of a chain of small element-wise ops per tensor.

Adam's update touches each parameter five times (two moments, bias correction, the step, weight decay);
unfused, each is a separate kernel launch and memory pass per tensor. A fused implementation does them in one
pass over all parameters, which matters most on GPUs with many small tensors.

`optim="adamw_ort_fused"` (the Optimum name) picks the best fused AdamW this runtime has:
- on CUDA in a run that trains with ORT, ONNX Runtime's `FusedAdam` (onnxruntime.training.optim; needs its
  CUDA `fused_ops` extension);
- otherwise torch's `AdamW(fused=True)`, which has CPU kernels since torch 2.4 (and CUDA ones): a run without
  ORT never depends on ORT's extension for its optimizer (the current-torch runtime has no ORT at all).
The trainer records which one actually ran.
"""

from __future__ import annotations

from functools import lru_cache

from ortlab.accel import NOT_PROBED, Availability, package_version

ORT_NAME = "onnxruntime FusedAdam"
TORCH_NAME = "torch AdamW(fused=True)"


@lru_cache(maxsize=2)
def availability(probe: bool = False) -> Availability:
    """Which fused AdamW runs here. With `probe=True` each candidate takes one real optimizer step."""
    name = "fused_adam"
    if package_version("torch") is None:
        return Availability(name, False, "torch is not installed", "pip install torch")
    import torch

    cuda = torch.cuda.is_available()
    ort_error = None
    if cuda:
        ok, ort_error = _try_step(_ort_fused_adam, "cuda") if probe else (None, None)
        if ok:
            return Availability(
                name,
                True,
                f"{ORT_NAME} on CUDA (probed: one step)",
                "nothing to do",
                details={"implementation": ORT_NAME, "device": "cuda"},
            )
    device = "cuda" if cuda else "cpu"
    if probe:
        ok, err = _try_step(_torch_fused_adamw, device)
        if not ok:
            return Availability(
                name,
                False,
                f"{TORCH_NAME} failed a step on {device}: {err}",
                "upgrade torch to >= 2.4 (fused AdamW on CPU)",
            )
    reason = f"{TORCH_NAME} on {device.upper()}" + (" (probed: one step)" if probe else NOT_PROBED)
    if ort_error:
        reason += f"; {ORT_NAME} is not usable here: {ort_error}"
    remedy = (
        "nothing to do"
        if not cuda
        else "for ORT's FusedAdam, build ORT's CUDA extensions (needs nvcc and a CUDA 11.8 toolkit)"
    )
    return Availability(name, True, reason, remedy, details={"implementation": TORCH_NAME, "device": device})


def _torch_fused_adamw(params, lr: float = 1e-3, **kw):
    import torch

    return torch.optim.AdamW(params, lr=lr, fused=True, **kw)


def _ort_fused_adam(params, lr: float = 1e-3, **kw):
    from onnxruntime.training.optim import AdamWMode, FusedAdam

    # AdamWMode.ADAMW_TORCH: weight decay applied as in torch.optim.AdamW (decoupled)
    return FusedAdam(params, lr=lr, adam_w_mode=AdamWMode.ADAMW_TORCH, **kw)


def _try_step(make, device: str) -> tuple[bool, str | None]:
    try:
        import torch

        p = torch.nn.Parameter(torch.ones(4, device=device))
        opt = make([p])
        p.sum().backward()
        opt.step()
        if not bool((p < 1).all()):
            return False, "the parameter did not move"
        return True, None
    except Exception as e:
        return False, f"{type(e).__name__}: {str(e).strip()[:200]}"


def optimizer_cls_and_kwargs(device_type: str, with_ort: bool = True) -> tuple[type, dict, str]:
    """The fused AdamW class for `device_type`, its extra kwargs, and a human name of the implementation.

    ORT's FusedAdam only for a run that trains with ORT (`with_ort`) on CUDA; torch's fused AdamW otherwise.

    Returned in the shape of `Trainer(optimizer_cls_and_kwargs=...)`, so the Trainer still builds the parameter
    groups (weight decay off for biases and norms) and passes lr/betas/eps/weight_decay itself.
    """
    import torch

    if device_type == "cuda" and with_ort:
        ok, _ = _try_step(_ort_fused_adam, "cuda")
        if ok:
            from onnxruntime.training.optim import AdamWMode, FusedAdam

            return FusedAdam, {"adam_w_mode": AdamWMode.ADAMW_TORCH}, ORT_NAME
    return torch.optim.AdamW, {"fused": True}, TORCH_NAME


def describe(optimizer) -> tuple[bool, str]:
    """(is it fused, which implementation) for an optimizer that exists, looking inside wrappers."""
    inner = optimizer
    while hasattr(inner, "optimizer") and inner is not inner.optimizer:
        inner = inner.optimizer
    cls = type(inner).__name__
    if cls == "FusedAdam":
        return True, ORT_NAME
    fused = bool(getattr(inner, "defaults", {}).get("fused"))
    return fused, f"torch {cls}(fused={fused})"
