"""Can a model's forward be captured as a graph? ORTModule runs the Python `forward` only while exporting it.

Pure PyTorch (no ONNX Runtime here): `python_effects_of_forward` runs one eager forward and lists what Python did
that a graph cannot redo; the trainer then fails or sends ORTModule to PyTorch (`ort_module.force_fallback`,
which records a `ForwardNotCapturable` as the fallback's reason). Re-exported by `ortlab.accel.ort`.
"""

from __future__ import annotations


class ForwardNotCapturable(Exception):
    """The model's forward does Python things an exported graph cannot repeat (see python_effects_of_forward)."""


_SIMPLE = (int, float, bool, str, bytes, type(None))


def _attribute_state(model) -> dict[tuple[str, str], tuple]:
    """Plain Python attributes of every submodule (counters, flags, lists): how they look now, to compare and
    to restore. Tensors, submodules and nn.Module's own bookkeeping are left out (buffers are compared apart)."""
    import torch

    # nn.Module's bookkeeping, and transformers' record of the warnings it gave once (not model state)
    internal = set(vars(torch.nn.Module())) | {"training", "warnings_issued"}
    state = {}
    for prefix, module in model.named_modules():
        for key, value in vars(module).items():
            if key in internal or key.startswith("__"):
                continue
            if isinstance(value, _SIMPLE):
                state[(prefix, key)] = (value, value, None)
            elif isinstance(value, (list, dict, set)):
                # identity, and a shallow copy of the contents: an append or a new list both show
                copy = type(value)(value) if type(value) in (list, dict, set) else value.copy()
                state[(prefix, key)] = (value, copy, len(value))
    return state


def _changed(before: tuple, after: tuple | None) -> bool:
    if after is None:
        return True
    obj, contents, _ = before
    new_obj, new_contents, _ = after
    if isinstance(obj, _SIMPLE):
        return type(obj) is not type(new_obj) or obj != new_obj
    if obj is not new_obj:
        return True
    if isinstance(contents, list):
        if len(contents) != len(new_contents):
            return True
        return any(a is not b for a, b in zip(contents, new_contents, strict=True))
    if isinstance(contents, dict):
        return contents.keys() != new_contents.keys() or any(contents[k] is not new_contents[k] for k in contents)
    return contents != new_contents


def python_effects_of_forward(model, inputs: dict) -> list[str]:
    """Run `model(**inputs)` once in eager PyTorch (no gradients) and say what it did that a graph cannot redo.

    ORTModule exports `forward` by tracing it: whatever the Python code does besides tensor operations happens
    while exporting and never again (seen: a buffer meant to record every step recorded two entries; a
    `random.random()` draw became a constant, so the loss stopped varying). Looked for: buffers re-assigned or
    changed in place, plain Python attributes changed (counters, lists), and draws from Python's `random` or
    NumPy's global generator. torch's own random ops (dropout, torch.rand) are graph ops and are fine.

    Everything is put back afterwards (buffers, attributes, and the torch, CUDA, Python and NumPy random
    states), so the training that follows runs exactly as if this check had not happened.
    """
    import random

    import numpy as np
    import torch

    torch_state = torch.random.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    py_state = random.getstate()
    np_state = np.random.get_state()
    buffers = {name: (b, b.detach().clone()) for name, b in model.named_buffers()}
    attributes = _attribute_state(model)
    was_training = model.training
    problems: list[str] = []
    try:
        model.train()
        with torch.no_grad():
            model(**inputs)
        if random.getstate() != py_state:
            problems.append("draws random numbers with Python's `random` module")
        after_np = np.random.get_state()
        if after_np[0] != np_state[0] or after_np[2] != np_state[2] or not np.array_equal(after_np[1], np_state[1]):
            problems.append("draws random numbers with NumPy's global generator (np.random)")
        now = dict(model.named_buffers())
        for name, (tensor, value) in buffers.items():
            current = now.get(name)
            if current is None or current is not tensor:
                problems.append(f"re-assigns the buffer `{name}`")
            elif current.shape != value.shape or not torch.equal(current.detach(), value):
                problems.append(f"changes the buffer `{name}` in place")
        for name in now.keys() - buffers.keys():
            problems.append(f"registers the buffer `{name}`")
        after = _attribute_state(model)
        for (prefix, key), before in attributes.items():
            if _changed(before, after.get((prefix, key))):
                problems.append(f"changes the attribute `{(prefix + '.' if prefix else '') + key}`")
    finally:
        # put everything back
        modules = dict(model.named_modules())
        for name, (tensor, value) in buffers.items():
            owner, _, leaf = name.rpartition(".")
            module = modules[owner]
            with torch.no_grad():
                if tensor.shape == value.shape:
                    tensor.copy_(value)
            module._buffers[leaf] = tensor
        for (prefix, key), (obj, contents, _) in attributes.items():
            module = modules[prefix]
            if isinstance(contents, list):
                obj[:] = contents
            elif isinstance(contents, (dict, set)):
                obj.clear()
                obj.update(contents)
            vars(module)[key] = obj
        torch.random.set_rng_state(torch_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
        random.setstate(py_state)
        np.random.set_state(np_state)
        model.train(was_training)
    return problems
