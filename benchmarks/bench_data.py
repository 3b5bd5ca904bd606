"""Time to the first step and peak memory against dataset size: `ortlab train --max-steps 5` on a generated local
CSV (or Parquet) of short reviews, with rows tokenized all before step 1 (`data.lazy: false`, the eager path) or
as training reads them (`data.lazy: true`), or read as a stream too (`data.streaming: true`, the large-Hub-dataset
path: no Arrow conversion of the file, checks on a head); beside them, for a classifier, the same job written with
plain transformers (`trainer`: `load_dataset`, an eager `map`, `Trainer`), the baseline a user would compare with.

    .venv/bin/python benchmarks/bench_data.py                      # 20k and 400k rows, both paths
    .venv/bin/python benchmarks/bench_data.py --sizes 20000 400000 4000000 --format parquet
    .venv/bin/python benchmarks/bench_data.py --smoke              # 2k rows, seconds (the test runs this)
    .venv/bin/python benchmarks/bench_data.py --task chat          # causal-lm: raw text (--task text) or chat

Why this way: the cost being measured is what a run does with its data before step 1 (loading, checking,
splitting, tokenizing), so the model is the tests' tiny BERT (built here in a second, no download) and every row
runs in its own process with its own empty `datasets` cache (a first run, as a user's first try of a new file;
a warm cache would hide the tokenizing). Each process reports the seconds from its start to the first step's
record (imports included, the same for every row), the seconds spent in `load_and_check` and in `tokenize`
(timed by wrapping them), and its own peak resident memory (VmHWM). Rows run one after another:
these are seconds-scale phases, not throughput ratios; `--repeat N` runs N rounds of every row in turn and reports
medians (on a shared machine one round can be twice another). Results go to benchmarks/results/data-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

STARTED = time.monotonic()
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from common import cpu_name, write_report  # noqa: E402

WORDS = [
    "film",
    "movie",
    "plot",
    "actor",
    "story",
    "scene",
    "great",
    "dull",
    "funny",
    "slow",
    "moving",
    "charming",
    "clumsy",
    "brilliant",
    "tired",
    "fresh",
    "witty",
    "long",
    "short",
    "music",
    "score",
    "ending",
    "director",
    "script",
    "cast",
    "performance",
    "heart",
    "mess",
    "joy",
    "bore",
    "delight",
]


# data.lazy false; data.lazy true; data.lazy and data.streaming true; plain transformers (classification only)
PATHS = ("eager", "lazy", "stream", "trainer")
TASKS = ("classification", "text", "chat")  # reviews with labels; raw text for a causal LM; conversations, packed
LM_LENGTH = 64  # causal-lm blocks and packed rows (the tiny LMs have 128 positions)


def generate(path: Path, rows: int, seed: int = 0) -> Path:
    """`rows` short reviews (5 to 20 words) with a fresh/rotten label, as CSV or Parquet by `path`'s suffix."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(5, 20))) for _ in range(rows)]
    labels = [rng.choice(("fresh", "rotten")) for _ in range(rows)]
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": texts, "label": labels}), path)
    else:
        import csv

        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows(zip(texts, labels, strict=True))
    return path


def generate_lm(path: Path, rows: int, task: str, seed: int = 0) -> Path:
    """`rows` of JSON lines: raw text (a paragraph of 5 to 40 words) or a conversation (a review to judge, a
    one-word answer), the causal-lm rows of `task`."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(rows):
            words = " ".join(rng.choices(WORDS, k=rng.randint(5, 40)))
            if task == "text":
                row: dict = {"text": words}
            else:
                answer = rng.choice(("fresh", "rotten"))
                question = {"role": "user", "content": f"Fresh or rotten? {words}"}
                turns = [question, {"role": "assistant", "content": answer}]
                row = {"messages": turns}
            f.write(json.dumps(row) + "\n")
    return path


def _spec(task: str, data: str, model: str, path: str, steps: int, out: str) -> dict:
    spec = {
        "task": "sequence-classification",
        "model": {"name": model},
        "data": {"source": data, "lazy": path != "eager", "streaming": path == "stream", "max_eval_samples": 64},
        "hyper": {"max_steps": steps, "batch_size": 16, "logging_steps": 1},
        "output_dir": str(Path(out).parent / "runs"),
    }
    if task != "classification":
        spec["task"] = "causal-lm"
        spec["hyper"]["max_length"] = LM_LENGTH
        spec["data"]["packing"] = task == "chat"
    return spec


def child(task: str, data: str, model: str, path: str, out: str, steps: int) -> None:
    """One row: train `steps` steps and write its timings to `out` (runs in its own process)."""
    import resource

    from ortlab import fit
    from ortlab.data import inputs
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    phases: dict[str, float] = {}
    anon = _AnonPeak()

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[f"{name}_s"] = phases.get(f"{name}_s", 0.0) + time.monotonic() - t

        return wrapper

    # Timed where they are called from: `fit` binds load_and_check when it is imported; assembly looks the task's
    # tokenize up by its path (`Task.part`: ortlab.data.inputs.tokenize for these tasks) when it runs.
    fit.load_and_check = timed("load_and_check", fit.load_and_check)
    inputs.tokenize = timed("tokenize", inputs.tokenize)
    first: dict[str, float] = {}

    def on_metrics(record: dict) -> None:
        if record.get("event") == "step" and "first_step_s" not in first:
            first["first_step_s"] = time.monotonic() - STARTED
        if isinstance(record.get("summary"), dict) and record["summary"].get("steady_samples_per_s"):
            first["steady_samples_per_s"] = record["summary"]["steady_samples_per_s"]  # steps after the warm-up

    spec = RunSpec.model_validate(_spec(task, data, model, path, steps, out))
    train_spec(spec, progress=False, on_metrics=on_metrics, log=lambda line: None)
    peak_mb = _peak_rss_mb() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    record = {**first, **phases, "total_s": time.monotonic() - STARTED, "peak_mem_mb": peak_mb}
    Path(out).write_text(json.dumps({**record, "peak_anon_mb": anon.stop()}))


def child_trainer(data: str, model: str, out: str, steps: int) -> None:
    """The baseline row (path `trainer`): what a user writes with plain transformers, on the same CSV and model:
    `load_dataset`, a 10 % hold-out, the labels encoded, every row tokenized with an eager `map`, then
    `Trainer` (batch 16, dynamic padding, the same max length as ortlab's default), timed the same way."""
    import datasets
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    anon = _AnonPeak()
    phases: dict[str, float] = {}
    t = time.monotonic()
    raw = datasets.load_dataset("csv", data_files={"train": data})["train"].class_encode_column("label")
    split = raw.train_test_split(test_size=0.1, seed=42)
    phases["load_and_check_s"] = time.monotonic() - t
    tokenizer = AutoTokenizer.from_pretrained(model)
    t = time.monotonic()
    train = split["train"].map(lambda b: tokenizer(b["text"], truncation=True, max_length=128), batched=True)
    phases["tokenize_s"] = time.monotonic() - t
    clf = AutoModelForSequenceClassification.from_pretrained(model, num_labels=2)
    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.monotonic())

    args = TrainingArguments(
        output_dir=str(Path(out).parent / "trainer-out"),
        max_steps=steps,
        per_device_train_batch_size=16,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
    )
    collator = DataCollatorWithPadding(tokenizer)
    Trainer(model=clf, args=args, train_dataset=train, data_collator=collator, callbacks=[Stamp()]).train()
    record = {"first_step_s": stamps[0] - STARTED, **phases, "total_s": time.monotonic() - STARTED}
    if len(stamps) > 3:  # the steps after a warm-up of 2, as ortlab's summary counts them
        record["steady_samples_per_s"] = 16 * (len(stamps) - 3) / (stamps[-1] - stamps[2])
    record["peak_mem_mb"] = _peak_rss_mb() or 0.0
    Path(out).write_text(json.dumps({**record, "peak_anon_mb": anon.stop()}))


class _AnonPeak:
    """The process's peak anonymous resident memory (RssAnon, sampled every 20 ms in a thread): the memory it owns.

    VmHWM also counts the pages of memory-mapped files it has touched (datasets maps its Arrow files: at 4M rows
    about 0.4 GB of page cache the kernel can drop at any time), so the two are reported side by side."""

    def __init__(self) -> None:
        import threading

        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    self.peak = max(self.peak, int(line.split()[1]))
            self._stop.wait(0.02)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 1024


def _peak_rss_mb() -> float | None:
    """This process's own peak resident memory (VmHWM). Not ru_maxrss: Linux carries the parent's peak into a
    forked and exec'd child's ru_maxrss, and this parent holds the generated rows (a 4M-row child read 1,239 MB by
    ru_maxrss and 807 MB measured inside)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def run_row(
    task: str,
    data: Path,
    model: Path,
    path: str,
    steps: int,
    work: Path,
    round_: int = 0,
    root: Path = ROOT,
    tree: str = "this",
) -> dict:
    """One row in its own process, with ortlab from `root` (this checkout, or `--baseline`'s)."""
    out = work / f"row-{path}-{tree}-{data.stem}-{round_}.json"  # its own cache too: every round starts cold
    env = {**os.environ, "HF_DATASETS_CACHE": str(work / f"cache-{out.stem}"), "PYTHONPATH": str(root)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", task, str(data), str(model), path, str(out)]
    proc = subprocess.run([*cmd, str(steps)], capture_output=True, text=True, env=env, cwd=root)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[20_000, 400_000])
    p.add_argument("--format", choices=("csv", "parquet"), default="csv")
    p.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeat", type=int, default=1, help="rounds of every row; the medians are reported")
    p.add_argument("--smoke", action="store_true", help="2,000 rows, both paths (seconds)")
    p.add_argument("--output", default=None, help="result JSON (default: benchmarks/results/data-<date>.json)")
    p.add_argument(
        "--baseline",
        help="another checkout of ortlab (e.g. `git worktree add /tmp/base main`): each row also runs with its "
        "ortlab, in turn with this one's (A/B rounds), reported as tree 'baseline'",
    )
    p.add_argument(
        "--data-dir",
        help="keep the generated files here and reuse them in a later invocation (the same seed writes the same "
        "rows; generating 4M rows holds them in this process for a while, a burden on a machine short of memory)",
    )
    p.add_argument("--task", choices=TASKS, default="classification", help="text, chat: causal-lm rows (JSONL)")
    p.add_argument(
        "--model",
        help="a model folder for the task instead of the tiny one (e.g. the embedded MiniLM, for throughput at a "
        "real model's step time: the tiny models make the data path most of a step)",
    )
    p.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    opts = p.parse_args()
    if opts.child:
        task, data, model, path, out, steps = opts.child
        if path == "trainer":
            child_trainer(data, model, out, int(steps))
        else:
            child(task, data, model, path, out, int(steps))
        return
    sizes = [2_000] if opts.smoke else opts.sizes
    trees = {"this": ROOT, **({"baseline": Path(opts.baseline).resolve()} if opts.baseline else {})}
    load_at_start = os.getloadavg()  # the machine is shared: its load goes beside the figures
    sys.path.insert(0, str(ROOT))
    from tests.helpers.tiny_models import build_tiny_bert, build_tiny_chat_llama, build_tiny_gpt2

    results = []
    task, fmt = opts.task, opts.format if opts.task == "classification" else "jsonl"
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        work = Path(tmp)
        build = {"classification": build_tiny_bert, "text": build_tiny_gpt2, "chat": build_tiny_chat_llama}[task]
        model = Path(opts.model) if opts.model else build(work / f"tiny-{task}")
        for n in sizes:
            t = time.monotonic()
            name = f"reviews-{n}.{fmt}" if task == "classification" else f"{task}-{n}.jsonl"
            kept = Path(opts.data_dir) / name if opts.data_dir else None
            if kept and kept.exists():
                data = kept
            elif task == "classification":
                data = generate(kept or work / name, n)
            else:
                data = generate_lm(kept or work / name, n, task)
            made = time.monotonic() - t
            rows = {
                (path, tree): {"rows": n, "task": task, "format": fmt, "path": path, "tree": tree, "generate_s": made}
                for path in opts.paths
                if path != "trainer" or task == "classification"  # the plain-transformers row: a classifier's
                for tree in trees
            }
            for r in range(opts.repeat):  # rounds in turn: a busy spell of the machine hits every path alike
                for (path, tree), row in rows.items():
                    print(f"[bench] {n:,} rows, {path} ({tree}), round {r + 1}/{opts.repeat} ...", flush=True)
                    got = run_row(task, data, model, path, opts.steps, work, r, trees[tree], tree)
                    row.setdefault("runs", []).append(got)
                    print(f"[bench]   {json.dumps(got)}", flush=True)
            for row in rows.values():
                done = [x for x in row["runs"] if "error" not in x]
                if not done:
                    row["error"] = row["runs"][0]["error"]
                keys = ("first_step_s", "load_and_check_s", "tokenize_s", "total_s", "peak_mem_mb", "peak_anon_mb")
                for key in (*keys, "steady_samples_per_s"):
                    if done and all(key in x for x in done):
                        row[key] = statistics.median(x[key] for x in done)  # the median of the rounds
                results.append(row)
    base = {(r["rows"], r["path"], r["tree"]): r for r in results}
    smallest = min(sizes)
    for r in results:
        ref = base.get((smallest, r["path"], r["tree"]), {})
        if "first_step_s" in r and "first_step_s" in ref:
            r["first_step_vs_smallest"] = r["first_step_s"] / ref["first_step_s"]
        eager = base.get((r["rows"], "eager", r["tree"]), {})
        if r.get("steady_samples_per_s") and eager.get("steady_samples_per_s"):  # the preparation keeps ahead?
            r["throughput_vs_eager"] = r["steady_samples_per_s"] / eager["steady_samples_per_s"]
        plain = base.get((r["rows"], "trainer", r["tree"]), {})
        if r["path"] != "trainer" and "first_step_s" in r and "first_step_s" in plain:  # against plain transformers
            r["first_step_vs_trainer"] = r["first_step_s"] / plain["first_step_s"]
            if r.get("steady_samples_per_s") and plain.get("steady_samples_per_s"):
                r["throughput_vs_trainer"] = r["steady_samples_per_s"] / plain["steady_samples_per_s"]
    report = {
        "benchmark": "bench_data",
        "method": "one process per row, a cold datasets cache each; tiny BERT (classification), tiny GPT-2 (raw "
        f"text), tiny ChatML Llama (chat, packed); causal-lm blocks of {LM_LENGTH} tokens; seconds from process "
        "start to the first step record; peak memory is the row process's VmHWM (which counts the pages of the "
        "memory-mapped Arrow files it touched), peak_anon_mb its anonymous resident memory sampled every 20 ms",
        "task": task,
        "model": opts.model or f"tiny ({task})",
        "load_at_start": load_at_start,
        "load_at_end": os.getloadavg(),
        "date": date.today().isoformat(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "smoke": opts.smoke,
        "steps": opts.steps,
        "repeat": opts.repeat,
        "batch_size": 16,
        "results": results,
    }
    kind = "" if task == "classification" else f"-{task}"
    name = f"data-{date.today().isoformat()}{kind}{'-smoke' if opts.smoke else ''}.json"
    path = write_report(report, opts.output, name)
    for r in results:
        print(
            f"{r['rows']:>9,} {r['path']:<6} {r['tree']:<8} first step {r.get('first_step_s', float('nan')):6.1f} s  "
            f"load+check {r.get('load_and_check_s', float('nan')):5.1f} s  tokenize {r.get('tokenize_s', 0):5.1f} s  "
            f"peak {r.get('peak_mem_mb', 0):6.0f} MB (anon {r.get('peak_anon_mb', 0):5.0f})  "
            f"{r.get('steady_samples_per_s', 0):6.1f} samples/s"
            + (f" ({r['throughput_vs_eager']:.2f}x eager)" if "throughput_vs_eager" in r else "")
            + f"  {r.get('error', '')}"
        )
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
