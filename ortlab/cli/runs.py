"""The commands about runs that exist: `runs`, `follow`, `stop`, `resume`, `compare`, `export`, `push`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ortlab.cli.common import RootOption, RunArgument, num, reported, run_named
from ortlab.runfolder import events


def list_runs(root: RootOption = None) -> None:
    """The runs under the runs folder: state, step, what applied, throughput."""
    from ortlab.runfolder.compare import render_runs, row_for
    from ortlab.runner import default_root, runs

    render_runs([row_for(run.dir) for run in runs(root)], title=f"runs in {root or default_root()}")


def follow(
    run_id: RunArgument,
    root: RootOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the raw JSON lines")] = False,
) -> None:
    """Print a run's metrics from the start, then live until it ends."""
    from ortlab.chat import strip_controls

    run = run_named(run_id, root)
    with reported():  # a status gone or damaged for a while: the reason, not a traceback
        _follow_lines(run, json_out)
    status = run.status()
    # status.json is the run folder's: its words reach the terminal without control characters (escape sequences)
    said = status.get("error") or status.get("damaged")
    print(strip_controls(f"{run.id}: {status['state']}" + (f" ({said})" if said else "")))
    if status["state"] in ("failed", "damaged"):
        raise typer.Exit(1)


def _follow_lines(run: Any, json_out: bool) -> None:
    import json

    from ortlab.scores import format_scores

    for r in run.follow():
        if json_out:
            print(json.dumps(r), flush=True)
        elif r.get("event") == events.STEP:
            print(
                f"step {r.get('step', '?'):>6}  loss {num(r.get('loss'), '.4f')}  "
                f"{num(r.get('samples_per_s'), '.1f')} samples/s  {num(r.get('step_time_s'), '.2f')} s/step  "
                f"peak {num(r.get('peak_mem_mb'), '.0f')} MB",
                flush=True,
            )
        elif r.get("event") == events.EVAL:
            scores = format_scores(r)
            print(f"eval {r.get('phase', '')} (step {r.get('step')}): {scores}", flush=True)
        elif r.get("event") in (events.ACCELERATION, events.STOPPED, events.RESUME):
            print(f"{r['event']}: {r.get('message') or r.get('checkpoint', '')}", flush=True)
        elif r.get("event") == events.GENERATIONS:
            from ortlab.chat import generation_lines

            for line in generation_lines(r):
                print(line, flush=True)


def stop_run(run_id: RunArgument, root: RootOption = None) -> None:
    """Stop a run gracefully: it finishes its step, saves a checkpoint and ends `stopped`."""
    with reported():  # a damaged folder, or a process that is not the run's: nothing was signalled
        status = run_named(run_id, root).stop()
    typer.echo(
        f"{run_id}: {status['state']}" + (f", checkpoint {status['checkpoint']}" if status.get("checkpoint") else "")
    )


def resume(
    run_id: RunArgument,
    root: RootOption = None,
    python: Annotated[
        str | None,
        typer.Option(
            help="resume in this interpreter (the run folder's target.python is started only when it is this "
            "Python, an ortlab runtime or listed in $ORTLAB_TRUSTED_PYTHONS)"
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            help="resume on this Ray cluster address (your Ray token goes to the folder's target.cluster only when "
            "it is 'local' or listed in $ORTLAB_RAY_ADDRESSES)"
        ),
    ] = None,
    hub_token: Annotated[
        bool,
        typer.Option(
            "--hub-token",
            help="send your Hugging Face token with the Hub downloads of a run folder you did not launch here (a "
            "folder from elsewhere resumes without it)",
        ),
    ] = False,
) -> None:
    """Continue a stopped run from its last checkpoint (in the background; watch with `ortlab follow`)."""
    run = run_named(run_id, root)
    with reported():
        run.resume(python=python, cluster=cluster, hub_token=hub_token)
    typer.echo(f"resumed {run.id}; watch it with: ortlab follow {run.path}")


def compare_runs(
    run_ids: Annotated[list[str], typer.Argument(help="runs to compare (ids or folders)")],
    baseline: Annotated[str | None, typer.Option(help="the run the ratios are against (default: the first)")] = None,
    root: RootOption = None,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Compare runs: mix requested and applied, throughput, warm-up, memory, loss and eval, as ratios."""
    import json
    from dataclasses import asdict

    from ortlab.runfolder.compare import compare, render

    runs_ = [run_named(r, root) for r in run_ids]
    with reported(ValueError):
        rows = compare([r.dir for r in runs_], baseline=baseline)
    if json_out:
        print(json.dumps([asdict(r) for r in rows], indent=2, default=str))
    else:
        render(rows)


def export(
    run_id: Annotated[str, typer.Argument(help="a completed run (id or folder)")],
    root: RootOption = None,
    samples: Annotated[int, typer.Option(help="eval samples for the parity check")] = 64,
    optimize: Annotated[bool, typer.Option(help="also save ORT's offline-optimized graph")] = False,
    quantize: Annotated[bool, typer.Option(help="also save a dynamic int8 quantization")] = False,
    cache: Annotated[
        bool,
        typer.Option(
            "--cache/--no-cache",
            help="causal LM: past key values in and out, one step per generated token (--no-cache: the graph "
            "without them, which re-runs the whole prefix per token)",
        ),
    ] = True,
    fmt: Annotated[
        str, typer.Option("--format", help="onnx, or gguf (llama.cpp / Ollama; causal LMs of the llama family)")
    ] = "onnx",
    quant: Annotated[
        list[str] | None, typer.Option("--quant", help="gguf: f16, bf16 or q8_0 (repeat for several; default q8_0)")
    ] = None,
    prompts: Annotated[int, typer.Option(help="gguf: held-out prompts for the parity check")] = 20,
) -> None:
    """Export a finished run to ONNX (<run>/onnx/) or GGUF (<run>/gguf/), and check it against the trained model."""
    from rich.console import Console
    from rich.table import Table

    from ortlab.export import export_onnx

    run = run_named(run_id, root)
    if fmt not in ("onnx", "gguf"):
        typer.echo(f"error: --format {fmt!r}: choose onnx or gguf", err=True)
        raise typer.Exit(2)
    if fmt == "gguf":
        _export_gguf(run, quant or ["q8_0"], prompts)
        return
    if quant:
        typer.echo("error: --quant is for --format gguf (ONNX: --quantize)", err=True)
        raise typer.Exit(2)
    with reported():
        report = export_onnx(run.dir, samples=samples, optimize=optimize, quantize=quantize, cache=cache)
    title = f"{run.id}: ONNX vs PyTorch on {report.samples} eval samples ({report.task})"
    if report.generation and report.generation.get("kv_cache"):  # causal LM with its cache: per token timed too
        gen = report.generation
        title += f"; per token = greedy generation of {gen['max_new_tokens']} tokens, {gen['inputs']} prompts"
    elif report.generation:  # seq2seq: latency is that of greedy generation, in both columns
        title += f"; latency = greedy generation up to {report.generation['max_length']} tokens"
    table = Table(title=title)
    for col in ("model", "max |diff|", "agreement", "accuracy", "latency", "good"):
        table.add_column(col)

    def latency(ms: dict[str, float]) -> str:
        return ", ".join(f"{k.replace('_', ' ')}: {v:.2f} ms" for k, v in ms.items())

    acc = report.pytorch_accuracy
    table.add_row("PyTorch", "", "", f"{acc:.4f}" if acc is not None else "-", latency(report.pytorch_latency_ms), "")
    for name, v in report.variants.items():
        speedup = ", ".join(f"{report.pytorch_latency_ms[k] / t:.2f}x" for k, t in v.latency_ms.items())
        table.add_row(
            f"{name} ({v.file})",
            f"{v.max_abs_diff:.2e}",
            f"{v.agreement:.4f}"
            + (f" (generated: {v.generation_agreement:.0%} equal)" if v.generation_agreement is not None else ""),
            f"{v.accuracy:.4f}" if v.accuracy is not None else "-",
            f"{latency(v.latency_ms)} (speed-up {speedup})",
            "[green]yes[/]" if v.good else "[red]NO[/]",
        )
    Console().print(table)
    print(f"written to {run.path / 'onnx'}")
    if not report.good:
        typer.echo("error: the ONNX model does not match PyTorch: it is not marked good", err=True)
        raise typer.Exit(1)


def _export_gguf(run, quants: list[str], prompts: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from ortlab.export import export_gguf

    with reported():
        report = export_gguf(run.dir, quant=quants, prompts=prompts)
    table = Table(title=f"{run.id}: GGUF read back by transformers vs the trained model ({report.prompts_from})")
    for col in ("file", "size", "greedy identical", "max |logit diff|", "mean", "tolerance", "good"):
        table.add_column(col)
    for v in report.variants.values():
        table.add_row(
            v.file,
            f"{v.size_bytes / 2**20:.1f} MiB",
            f"{v.prompts_identical}/{v.prompts}",
            f"{v.max_abs_logit_diff:.3g}",
            f"{v.mean_abs_logit_diff:.3g}",
            f"{v.tolerance:g}",
            "[green]yes[/]" if v.good else "[red]NO[/]",
        )
    Console().print(table)
    print(f"written to {run.path / 'gguf'}")
    if report.modelfile:
        print(f"Ollama: cd {run.path / 'gguf'} && ollama create {run.id} -f Modelfile && ollama run {run.id}")
    else:
        print(f"no Modelfile: {report.modelfile_note}")
    if not report.good:
        typer.echo("error: a GGUF file does not match the trained model: it is marked failed, not published", err=True)
        raise typer.Exit(1)


def push(
    run_id: Annotated[str, typer.Argument(help="a completed run (id or folder)")],
    repo: Annotated[str | None, typer.Option(help="Hub repo id, e.g. you/my-model")] = None,
    to_folder: Annotated[Path | None, typer.Option(help="copy to a local folder instead of the Hub")] = None,
    git: Annotated[str | None, typer.Option(help="push to a git remote (with git-lfs) instead of the Hub")] = None,
    private: Annotated[bool, typer.Option(help="create the Hub repo private")] = False,
    overwrite: Annotated[bool, typer.Option(help="push into an existing repo / non-empty folder")] = False,
    include_checkpoints: Annotated[
        bool, typer.Option("--include-checkpoints", help="also upload checkpoints (optimizer states)")
    ] = False,
    merged: Annotated[
        bool, typer.Option("--merged", help="a LoRA run: publish the merged model instead of the adapter")
    ] = False,
    root: RootOption = None,
) -> None:
    """Publish a finished run: model (or a LoRA run's adapter), tokenizer, ONNX files (if exported), a model card."""
    import warnings

    from ortlab.publish import PublishWarning

    run = run_named(run_id, root)
    if sum(x is not None for x in (repo, to_folder, git)) != 1:
        typer.echo("error: give exactly one of --repo, --to-folder, --git", err=True)
        raise typer.Exit(2)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", PublishWarning)
        where = _publish(run, repo, to_folder, git, private, overwrite, include_checkpoints, merged)
    for w in said:  # what was left out (links, FIFOs in the run folder), as one line each, not a Python warning
        if issubclass(w.category, PublishWarning):
            typer.echo(f"warning: {w.message}", err=True)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    typer.echo(f"published {run.id}: {where}")


def _publish(run, repo, to_folder, git, private, overwrite, include_checkpoints, merged) -> str:
    from ortlab.publish import push_to_folder, push_to_git, push_to_hub

    with reported():
        if repo:
            where = push_to_hub(
                run.dir,
                repo,
                private=private,
                overwrite=overwrite,
                include_checkpoints=include_checkpoints,
                merged=merged,
            )
        elif to_folder:
            where = push_to_folder(
                run.dir, to_folder, overwrite=overwrite, include_checkpoints=include_checkpoints, merged=merged
            )
        else:
            where = f"{git} @ {push_to_git(run.dir, git, include_checkpoints=include_checkpoints, merged=merged)}"
    return str(where)
