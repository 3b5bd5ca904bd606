"""ortlab's ONNX Runtime session settings for CPU (docs/decisions/ort-and-runtimes.md, "ORT on CPU") reach the
session ORTModule builds: read back from the session itself after a training step, not from ortlab's own record."""

from __future__ import annotations

import json
import subprocess
import textwrap

from conftest import PYTHON, ROOT

# In a fresh interpreter: ORTModule keeps global state, and this must see ortlab's defaults as a run does.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from ortlab.accel import ort

    extra = json.loads(sys.argv[1])
    ort.CPU_SESSION.update(extra)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    module = ort.wrap(model, ort.ORTOptions(log_level="ERROR", fallback="error"))
    module(torch.randn(4, 8)).square().mean().backward()
    session = module._torch_module._execution_manager(True)._execution_agent._inference_session
    so = session.get_session_options()
    seen = {}
    for key in ort.CPU_SESSION:
        seen[key] = so.get_session_config_entry(key) if "." in key else str(getattr(so, key))
    print("RESULT " + json.dumps({"seen": seen, "torch_threads": torch.get_num_threads(),
                                  "recorded": {k: str(v) for k, v in module._ortlab_session.items()}}))
    """
)


def _run(extra: dict) -> dict:
    proc = subprocess.run(
        [PYTHON, "-c", SCRIPT, json.dumps(extra)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_cpu_session_settings_reach_the_ort_session():
    # ortlab's defaults, plus one more setting of each kind (an attribute, a config entry) to show the mechanism.
    out = _run({"inter_op_num_threads": 1, "session.force_spinning_stop": "1"})
    assert out["seen"] == out["recorded"], out
    # ORT's pool is as large as torch's (ORT would otherwise take one thread per physical core), and its idle
    # threads sleep rather than spin.
    assert out["seen"]["intra_op_num_threads"] == str(out["torch_threads"]), out
    assert out["seen"]["session.intra_op.allow_spinning"] == "0", out
    assert out["seen"]["inter_op_num_threads"] == "1" and out["seen"]["session.force_spinning_stop"] == "1", out
