"""One GPU session, as a lent machine allows it (minutes, no network): ortlab installed from its wheelhouse into the
machine's own Python, the CUDA tests, bench_gpu, the doctor on CUDA, and real ortlab runs whose result.json holds
the estimator's prediction beside what was measured.

Here (with the network), once:

    ortlab bundle --python 3.12 --out .wheelhouse        # ortlab[ui] and what it needs beyond torch & co.
    python benchmarks/gpu_session.py --pack .gpucheck    # SmolLM2-135M's config and tokenizer, chat and pair data

There (the GPU machine, in the repository's root; both folders carried):

    python3 benchmarks/gpu_session.py --out "$OUT"

Why this shape: a lent machine is bare and its time is short, so every part has its own time limit, the most
important parts run first (the wheelhouse install and what it must keep, the CUDA tests, bench_gpu), and each
part's output is a file of its own under --out, kept whatever happens to the parts after it. The runs use
SmolLM2-135M's published configuration and tokenizer with random weights (the same shapes and FLOPs; no 270 MB of
weights to carry), on the embedded chat and preference data.

Writes: install.json (packages before and after), tests.txt, gpu.json (bench_gpu), doctor.json, runs.json
(per run: the mix as applied, throughput, MFU, and predicted against measured peak memory and step time).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).parent / "ortlab")  # the console script pip put beside this Python
KEPT = ("torch", "transformers", "numpy", "pandas", "pyarrow", "tokenizers", "safetensors", "triton")


def packages() -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, check=True
    ).stdout
    return {p["name"].lower(): p["version"] for p in json.loads(out)}


def step(name: str, cmd: list[str], timeout: float, log: Path, env: dict | None = None) -> int:
    """Run one part with its own limit; its output goes to `log` and its tail to the console."""
    print(f"== {name} ({time.strftime('%H:%M:%S')}, at most {timeout:.0f} s)", flush=True)
    started = time.monotonic()
    with open(log, "w") as f:
        try:
            code = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})}
            ).returncode
        except subprocess.TimeoutExpired:
            code = 124
    tail = log.read_text(errors="replace").splitlines()[-15:]
    print("\n".join(tail), f"\n-- {name}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
    return code


def install(out: Path) -> None:
    before = packages()
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", ".wheelhouse", "ortlab[ui]"]
    code = step("install from the wheelhouse", cmd, 240, out / "install.log")
    after = packages()
    changed = {n: [v, after.get(n)] for n, v in before.items() if after.get(n) != v}
    added = sorted(n for n in after if n not in before)
    report = {"exit": code, "kept": {n: before.get(n) for n in KEPT}, "changed": changed, "added": added}
    (out / "install.json").write_text(json.dumps(report, indent=1))
    print(f"   changed: {changed or 'nothing'}; added {len(added)} packages", flush=True)


# Do torch.compile's fp32 matmuls run in TF32 where eager ones do not? Against float64, an fp32 matmul's relative
# error is ~1e-6 and a TF32 one's ~1e-3. (bench_gpu's first H200 run measured the compiled fp32 row at 3x the eager
# one, 253 % of the fp32 peak: not possible in IEEE fp32.)
TF32_PROBE = """
import json, torch
from ortlab.accel.precision import tf32_state
torch.manual_seed(0)
lin = torch.nn.Linear(4096, 4096, device="cuda")
x = torch.randn(512, 4096, device="cuda")
ref = x.double() @ lin.weight.double().T + lin.bias.double()
def err(y):
    return ((y.double() - ref).abs().max() / ref.abs().max()).item()
with torch.no_grad():
    eager, compiled = lin(x), torch.compile(lin)(x)
print(json.dumps({"eager_error": err(eager), "compiled_error": err(compiled), "state": tf32_state()}))
"""


def chat_spec(name: str, folder: Path, **extra: dict) -> dict:
    spec = {
        "name": name,
        "task": "causal-lm",
        "model": {"name": str(folder / "smollm2")},
        "data": {"source": str(folder / "chat.jsonl"), "max_train_samples": 4000, "max_eval_samples": 64},
        "hyper": {"batch_size": 16, "max_length": 512, "max_steps": 30, "eval_batch_size": 16},
        "generation": {"num_prompts": 0},
        "accel": {"ort": False, "tune": "off"},
    }
    for section, values in extra.items():
        spec.setdefault(section, {}).update(values)
    return spec


def runs(out: Path, pack: Path, budget_s: float) -> None:
    """Real ortlab runs (`ortlab train`), each in its own process; what each result.json says, gathered."""
    work = Path("/tmp/ortlab-gpu")
    shutil.rmtree(work, ignore_errors=True)
    (work / "smollm2").mkdir(parents=True)
    for f in pack.joinpath("smollm2").iterdir():
        shutil.copy(f, work / "smollm2" / f.name)
    for f in ("chat.jsonl", "pairs.jsonl"):
        shutil.copy(pack / f, work / f)
    make = (
        "import sys, torch; from transformers import AutoConfig, AutoModelForCausalLM; torch.manual_seed(0); "
        "m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1])); m.save_pretrained(sys.argv[1])"
    )
    step("random SmolLM2-135M weights", [sys.executable, "-c", make, str(work / "smollm2")], 120, out / "weights.log")
    specs = {
        "sft-full": chat_spec("sft-full", work, accel={"fused_adam": True}),
        "sft-lora": chat_spec("sft-lora", work, adapter={"kind": "lora", "rank": 16}),
        "dpo-lora": {
            **chat_spec("dpo-lora", work, adapter={"kind": "lora", "rank": 16}, hyper={"batch_size": 8}),
            "task": "preference",
            "data": {"source": str(work / "pairs.jsonl"), "max_train_samples": 2000, "max_eval_samples": 32},
            "generation": {},
        },
    }
    deadline = time.monotonic() + budget_s
    gathered = {}
    for name, spec in specs.items():
        left = deadline - time.monotonic()
        if left < 30:
            gathered[name] = {"error": "not run: the session's time for runs was spent"}
            continue
        path = work / f"{name}.json"
        path.write_text(json.dumps({**spec, "output_dir": str(work / "runs")}))
        code = step(f"run {name}", [CLI, "train", str(path)], left, out / f"run-{name}.log")
        result = work / "runs" / name / "result.json"
        data = json.loads(result.read_text()) if result.is_file() else {}
        gathered[name] = {
            "exit": code,
            "spec": spec,
            "summary": data.get("summary"),
            "estimate": data.get("estimate"),
            "accelerations": data.get("accelerations"),
            "device": data.get("device"),
        }
        (out / "runs.json").write_text(json.dumps(gathered, indent=1, default=str))


def pack_here(folder: Path) -> None:
    """What the runs need, from this machine's ortlab cache (the embedded assets, built once)."""
    from ortlab.assets import embedded_dataset, embedded_model_path

    model = embedded_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
    (folder / "smollm2").mkdir(parents=True, exist_ok=True)
    files = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    for f in files:
        shutil.copy(model / f, folder / "smollm2" / f)
    for name, target in (("rotten-tomatoes-chat", "chat.jsonl"), ("rotten-tomatoes-pairs", "pairs.jsonl")):
        lines = embedded_dataset(name)[0].read_text().splitlines()[:5000]
        (folder / target).write_text("\n".join(lines) + "\n")
    print(f"packed {folder}: {sum(f.stat().st_size for f in folder.rglob('*') if f.is_file()) / 2**20:.1f} MiB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="/tmp/gpu-session")
    p.add_argument("--pack", help="here: write what the runs need into this folder, and stop")
    p.add_argument("--from", dest="source", default=".gpucheck", help="the packed folder, there")
    p.add_argument("--skip", default="", help="parts to leave out: install,tests,probe,bench,doctor,runs")
    p.add_argument("--bench-args", default="--rounds 6", help="bench_gpu.py's arguments")
    p.add_argument("--bench-timeout", type=float, default=330.0)
    p.add_argument("--doctor-timeout", type=float, default=150.0)
    p.add_argument("--runs-timeout", type=float, default=180.0, help="seconds for all the runs together")
    opts = p.parse_args()
    if opts.pack:
        pack_here(Path(opts.pack))
        return
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, opts.skip.split(",")))
    if shutil.which("nvidia-smi"):
        subprocess.run(["nvidia-smi", "-L"])
    if "install" not in skip:
        install(out)
    if "tests" not in skip:
        tests = ["tests/test_gpu_defaults.py", "tests/test_cuda_path.py", "-k", "gpu_defaults or cuda_metrics"]
        pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
        step("CUDA tests", pytest, 180, out / "tests.txt")
    if "probe" not in skip:
        step("TF32 under torch.compile", [sys.executable, "-c", TF32_PROBE], 120, out / "tf32-probe.txt")
    if "bench" not in skip:
        bench = [sys.executable, "benchmarks/bench_gpu.py", "--output", str(out / "gpu.json"), *opts.bench_args.split()]
        step("bench_gpu", bench, opts.bench_timeout, out / "bench.log")
    if "doctor" not in skip:
        step("doctor", [CLI, "doctor", "--json", "--refresh"], opts.doctor_timeout, out / "doctor.json")
    if "runs" not in skip:
        runs(out, ROOT / opts.source, opts.runs_timeout)


if __name__ == "__main__":
    main()
