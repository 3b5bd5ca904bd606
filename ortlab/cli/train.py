"""The commands that make runs: `train`, `tune`, `notebook`, and `spec` (the default spec to start from)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ortlab.cli.common import num, reported
from ortlab.cli.options import SpecFile, build_spec, overrides, spec_option
from ortlab.cli.runs import follow
from ortlab.envvars import SAFE_PATH

if TYPE_CHECKING:
    from ortlab.spec import RunSpec


def train(
    spec_file: SpecFile = None,
    model: Annotated[str | None, spec_option("model")] = None,
    data: Annotated[str | None, spec_option("data")] = None,
    task: Annotated[str | None, spec_option("task")] = None,
    text_column: Annotated[str | None, spec_option("text_column")] = None,
    label_column: Annotated[str | None, spec_option("label_column")] = None,
    source_column: Annotated[str | None, spec_option("source_column")] = None,
    target_column: Annotated[str | None, spec_option("target_column")] = None,
    messages_column: Annotated[str | None, spec_option("messages_column")] = None,
    prompt_column: Annotated[str | None, spec_option("prompt_column")] = None,
    response_column: Annotated[str | None, spec_option("response_column")] = None,
    packing: Annotated[bool | None, spec_option("packing")] = None,
    preference_loss: Annotated[str | None, spec_option("preference_loss")] = None,
    beta: Annotated[float | None, spec_option("beta")] = None,
    reference: Annotated[str | None, spec_option("reference")] = None,
    max_train_samples: Annotated[int | None, spec_option("max_train_samples")] = None,
    max_eval_samples: Annotated[int | None, spec_option("max_eval_samples")] = None,
    epochs: Annotated[float | None, spec_option("epochs")] = None,
    max_steps: Annotated[int | None, spec_option("max_steps")] = None,
    learning_rate: Annotated[float | None, spec_option("learning_rate")] = None,
    batch_size: Annotated[int | None, spec_option("batch_size")] = None,
    max_length: Annotated[int | None, spec_option("max_length")] = None,
    max_target_length: Annotated[int | None, spec_option("max_target_length")] = None,
    gradient_checkpointing: Annotated[bool | None, spec_option("gradient_checkpointing")] = None,
    ort: Annotated[bool | None, spec_option("ort")] = None,
    fused_adam: Annotated[bool | None, spec_option("fused_adam")] = None,
    zero_stage: Annotated[int | None, spec_option("zero_stage")] = None,
    precision: Annotated[str | None, spec_option("precision")] = None,
    tune: Annotated[bool, spec_option("tune")] = False,
    tf32: Annotated[bool | None, spec_option("tf32")] = None,
    torch_compile: Annotated[bool | None, spec_option("torch_compile")] = None,
    tcmalloc: Annotated[bool | None, spec_option("tcmalloc")] = None,
    lora: Annotated[bool | None, spec_option("lora")] = None,
    adapter_rank: Annotated[int | None, spec_option("adapter_rank")] = None,
    report_to: Annotated[list[str] | None, spec_option("report_to")] = None,
    budget_minutes: Annotated[float | None, spec_option("budget_minutes")] = None,
    budget_memory_gb: Annotated[float | None, spec_option("budget_memory_gb")] = None,
    output_dir: Annotated[str | None, spec_option("output_dir")] = None,
    name: Annotated[str | None, spec_option("name")] = None,
    seed: Annotated[int | None, spec_option("seed")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress bar")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="show every library's output (default: in the run's logs/run.log)")
    ] = False,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="run in the background; watch with `ortlab follow RUN`")
    ] = False,
    cluster: Annotated[str | None, spec_option("cluster")] = None,
    processes: Annotated[int | None, spec_option("processes")] = None,
    storage: Annotated[str | None, spec_option("storage")] = None,
    max_failures: Annotated[int | None, spec_option("max_failures")] = None,
) -> None:
    """Train a RunSpec: checks everything first, then trains in the foreground (or detached) and prints eval
    before and after."""

    given = overrides(locals())
    try:
        with reported():
            spec = build_spec(spec_file, given)
            readable_again = spec_file is None or spec_file.is_file()  # (not a pipe: read once, gone)
            result = _train(
                spec, adapter_rank=adapter_rank, quiet=quiet, verbose=verbose, detach=detach, again=readable_again
            )
    except KeyboardInterrupt:
        typer.echo("interrupted: the run is marked failed (its folder keeps what was written)", err=True)
        raise typer.Exit(130) from None
    if result is not None and result.get("stopped"):  # asked to stop (`ortlab stop`, SIGTERM): its checkpoint kept
        run_dir = Path(result["run_dir"])
        from ortlab.runner import default_root

        where = "" if run_dir.parent.resolve() == default_root().resolve() else f" --root {run_dir.parent}"
        typer.echo(f"stopped: continue it with: ortlab resume {run_dir.name}{where}")
    elif result is not None:
        _print_result(result)


def _train(
    spec: RunSpec, *, adapter_rank: int | None, quiet: bool, verbose: bool, detach: bool, again: bool = False
) -> dict | None:
    """Start `spec` in one call (`runner.launch`) with the launcher the switch gives (`runner.launcher_for`, asked
    whether this process may train it) and follow it: in this process with the terminal's view (returns the
    result), or launched and followed through its run folder unless `detach` (returns None). `again`: this command
    may be started again, with another allocator (`_allocator`)."""
    from ortlab.runfolder.naming import check_output_folder
    from ortlab.runner import default_root, launch, launcher_for
    from ortlab.spec import SpecError

    if adapter_rank is not None and spec.adapter.kind == "none":
        raise SpecError(["adapter.rank: --adapter-rank sets the rank of a LoRA adapter; add --lora to train one"])
    check_output_folder(spec.output_dir)  # before the model and data checks (13-20 s), on every path below
    launcher = launcher_for(spec, here=not detach)
    if launcher.in_process:  # it trains here: the allocator is chosen as this process starts, the terminal shows it
        from ortlab.runner.foreground import Foreground
        from ortlab.train.terminal import Terminal

        if again:
            _allocator(spec)
        with Terminal(verbose=verbose, progress=not quiet) as terminal:
            here = Foreground(terminal, progress=not quiet)
            launch(spec, launcher=here)
        return here.result or {}
    # Launched (another interpreter, several processes, ortlab's compile runtime, a cluster, or --detach): `launch`
    # checks the target; the model and data are checked once, in the run process, where a problem ends the run
    # `failed` with its message (following it prints that message; `ortlab follow` does for a detached run).
    run = launch(spec, launcher=launcher)
    root = Path(spec.output_dir)
    where = "" if root.resolve() == default_root().resolve() else f" --root {root}"
    if detach:
        typer.echo(f"launched {run.id} ({run.path}); watch it with: ortlab follow {run.id}{where}")
        return None
    typer.echo(f"launched {run.id} ({run.path}); following it (Ctrl-C stops following, not the run)")
    try:
        follow(run.id, root=root)
    except KeyboardInterrupt:
        typer.echo(f"\nstill running: ortlab follow {run.id}{where}", err=True)
        raise typer.Exit(130) from None
    return None


AGAIN = "ORTLAB_STARTED_AGAIN"  # set in the command started again: it never starts itself a third time
# The first Python that honours PYTHONSAFEPATH: an older one would import from the user's folder when started again
# with `-m`, so it is not started again (it trains with glibc's malloc, and its run record says tcmalloc did not apply).
SAFE_PATH_PYTHON = (3, 11)


def _allocator(spec: RunSpec) -> None:
    """Start this very command again with tcmalloc, when the run should train with it and this process did not start
    with it (`ortlab.accel.tcmalloc`: an allocator is chosen when a process starts). Does not return then. Before
    anything is loaded: what the first process did (reading the spec) costs about half a second.

    Only where the command owns its process (`common.WHOLE_PROCESS`: not a test's or a script's call of `app`).
    The second process trains with glibc's malloc if the loader did not load the library after all, and its run
    record says tcmalloc did not apply."""
    from ortlab.accel import tcmalloc
    from ortlab.cli import common

    if not common.WHOLE_PROCESS or os.environ.get(AGAIN) or tcmalloc.loaded() is not None:
        return
    if not tcmalloc.wanted(spec.accel.tcmalloc) or sys.version_info < SAFE_PATH_PYTHON:
        return
    # `python -m` would put this folder, the user's, first on the new process's import path (a typer.py or yaml.py
    # here would run, with the allocator preloaded): PYTHONSAFEPATH keeps it off. The folder itself stays, since the
    # command's relative paths (the spec file, --data, --output-dir) are relative to it.
    env = {**tcmalloc.process_env(dict(os.environ), on=True), **SAFE_PATH, AGAIN: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "ortlab.cli", *sys.argv[1:]], env)


def tune_cmd(
    spec_file: SpecFile = None,
    model: Annotated[str | None, spec_option("model")] = None,
    data: Annotated[str | None, spec_option("data")] = None,
    task: Annotated[str | None, spec_option("task")] = None,
    text_column: Annotated[str | None, spec_option("text_column")] = None,
    label_column: Annotated[str | None, spec_option("label_column")] = None,
    source_column: Annotated[str | None, spec_option("source_column")] = None,
    target_column: Annotated[str | None, spec_option("target_column")] = None,
    batch_size: Annotated[int | None, spec_option("batch_size")] = None,
    max_length: Annotated[int | None, spec_option("max_length")] = None,
    cache: Annotated[bool, typer.Option("--cache/--no-cache", help="reuse an earlier measurement")] = True,
    compile: Annotated[
        bool, typer.Option("--compile", help="also measure torch.compile (its warm-up takes a minute or more)")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Measure which acceleration mix trains fastest here, on the spec's model and batches (about a minute).

    Runs that leave accelerations at 'auto' reuse the result (cached per model, shapes and machine)."""
    given = overrides(locals())
    import json

    from ortlab.tune import tune_spec

    with reported():
        spec = build_spec(spec_file, given)
        say = lambda m: typer.echo(m, err=json_out)  # noqa: E731
        result = tune_spec(spec, progress=say, use_cache=cache, compile=compile, baselines=True)
    if json_out:
        print(json.dumps(result.to_dict(), indent=2, default=str))
        return
    _print_tune(result)


def _print_tune(result: Any) -> None:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ortlab.runfolder.compare import OVER_PEAK

    console = Console(highlight=False)
    table = Table(title=None, box=box.SIMPLE_HEAD, pad_edge=False, caption="x: ratio, paired round by round")
    table.add_column("mix", no_wrap=True)  # whole names: the verdicts fold instead
    for col in ("samples /s", "x plain", "x Trainer", "x Trainer bf16", "% of peak", "warm-up s"):
        table.add_column(col, justify="right", overflow="fold")
    table.add_column("verdict", overflow="fold")
    for m in [*result.candidates, *result.references]:
        table.add_row(
            m.name,
            num(m.samples_per_s, ".1f"),
            num(m.ratio, ".2f"),
            num(m.vs_trainer, ".2f"),
            num(m.vs_trainer_bf16, ".2f"),
            num(m.peak_pct, ".0f") + ("%" if m.peak_pct is not None else "") + ("!" if (m.peak_pct or 0) > 100 else ""),
            num(m.warmup_s, ".1f"),
            m.verdict,
        )
    console.print(table)
    if result.peaks:
        peaks = ", ".join(
            f"{p} {v['flops'] / 1e12:.2f} TFLOP/s" for p, v in result.peaks.items() if isinstance(v.get("flops"), float)
        )
        console.print(f"% of peak: model FLOP/s over this machine's measured matmul peak ({peaks})")
    if any((m.peak_pct or 0) > 100 for m in [*result.candidates, *result.references]):
        console.print(f"[yellow]! {escape(OVER_PEAK)}[/]")
    how = "cached measurement" if result.cached else f"measured in {result.calibration_s:.0f} s"
    console.print(f"fastest here: [bold]{result.chosen}[/] ({how}, {result.rounds} interleaved rounds)")
    if result.choice.get("torch_compile"):
        console.print("torch.compile is never chosen for you: set accel.torch_compile (--torch-compile) to use it")
    else:
        console.print("runs that leave ort / fused_adam / precision at 'auto' on this model and batch shape use it")


def _print_result(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    # The path on a line of its own, whole: a table title would wrap it into the table's width.
    console.print(f"[bold]run[/] {result['run_dir']}", soft_wrap=True)
    table = Table()
    table.add_column("metric")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    from ortlab.scores import eval_scores

    before = eval_scores(result["eval_before"])
    for name, value in eval_scores(result["eval_after"]).items():
        table.add_row(name, f"{before[name]:.4f}" if name in before else "", f"{value:.4f}")
    console.print(table)
    s = result["summary"]
    applied = [k for k, v in result["accelerations"].items() if v["applied"]]
    not_applied = [k for k, v in result["accelerations"].items() if v["requested"] and not v["applied"]]
    console.print(
        f"steady state: {s.get('steady_samples_per_s', 0):.1f} samples/s, {s.get('steady_tokens_per_s', 0):.0f} "
        f"tokens/s; warm-up {s['warmup_time_s']:.1f} s; peak memory {s['peak_mem_mb']:.0f} MB"
    )
    if isinstance(s.get("steady_mfu"), (int, float)):
        from rich.markup import escape

        from ortlab.runfolder.compare import OVER_PEAK, over_peak

        mfu = f"MFU {100 * s['steady_mfu']:.1f}% of this machine's measured matmul peak"
        if over_peak(s["steady_mfu"]):
            mfu = f"[yellow]MFU {100 * s['steady_mfu']:.1f}%: {escape(OVER_PEAK)}[/]"
        console.print(f"model FLOPs: {s.get('steady_model_tflops_per_s', 0):.3f} TFLOP/s, {mfu}", soft_wrap=True)
    console.print(f"accelerations applied: {', '.join(applied) or 'none'}")
    params = result.get("parameters") or {}
    if params.get("total"):
        trained = "LoRA adapter" if result.get("adapter") else "every weight"
        console.print(
            f"trained: {trained}, {params['trainable']:,} of {params['total']:,} parameters; optimizer state "
            f"{params.get('optimizer_state_bytes', 0) / 2**20:.1f} MiB"
        )
    if not_applied:
        console.print(f"[red]requested but NOT applied: {', '.join(not_applied)}[/]")


def notebook(
    path: Annotated[Path, typer.Argument(help="the notebook to run, e.g. notebooks/01-quickstart.ipynb")],
    param: Annotated[list[str] | None, typer.Option("-p", "--param", help="NAME=VALUE (YAML value)")] = None,
    output: Annotated[Path | None, typer.Option(help="executed notebook (default: <name>.out.ipynb)")] = None,
) -> None:
    """Run a notebook with parameters through papermill (every cell; a failing cell fails the command)."""
    import yaml

    from ortlab.notebooks import run_notebook

    parameters = {}
    for item in param or []:
        name, sep, value = item.partition("=")
        if not sep:
            typer.echo(f"error: -p takes NAME=VALUE, got {item!r}", err=True)
            raise typer.Exit(2)
        parameters[name] = yaml.safe_load(value)
    with reported(code=1):
        out = run_notebook(path, output or path.with_suffix(".out.ipynb"), parameters)
    typer.echo(f"executed: {out}")


def spec(
    schema: Annotated[bool, typer.Option("--schema", help="print the JSON schema instead of the default spec")] = False,
) -> None:
    """Print the default RunSpec as YAML (a starting point for your own), or its JSON schema."""
    import json

    from ortlab.spec import RunSpec

    print(json.dumps(RunSpec.json_schema(), indent=2) if schema else RunSpec().to_yaml())
