"""The `ortlab` command line. Each command is a thin layer over the Python API of the same name."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from ortlab.errors import OrtlabError


class _Commands(TyperGroup):
    """Lists each command with its whole first sentence, wrapped: click cuts it to one line ("the...")."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: Any) -> Any:
        # The one place every command's OrtlabError ends: its message, no traceback (anything else keeps its own).
        try:
            return super().invoke(ctx)
        except OrtlabError as e:
            _user_error(e)


# Help is click's plain layout, not typer's rich panels: those split 76 columns among six table columns (option,
# short option, --no- option, its short form, type, help) and, at 80 columns, cut option names short
# (`--max-train-sampl…`); they also read help text as rich markup (`ortlab[ui]` lost its `[ui]`). Click wraps the
# descriptions and never cuts a name (a long one gets its description on the next line).
PLAIN_HELP: dict[str, Any] = {"rich_markup_mode": None, "cls": _Commands}

app = typer.Typer(
    help="ortlab: fine-tune Hugging Face models fast, with ONNX Runtime training and friends.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    **PLAIN_HELP,
)


def _show_version(value: bool) -> None:
    if value:
        import platform

        from ortlab import __version__

        typer.echo(f"ortlab {__version__} (Python {platform.python_version()}, {sys.executable})")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_show_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """ortlab: fine-tune Hugging Face models fast, with ONNX Runtime training and friends."""


@app.command()
def info(
    root: Annotated[
        Path | None, typer.Option(help="folder holding the runs (default: $ORTLAB_RUNS or ./ortlab-runs)")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print it as JSON")] = False,
) -> None:
    """Where the runs are, which Python runs ortlab, the versions that matter, the doctor's last answer.

    Nothing is probed here (the doctor's answer comes from its cache), so it answers at once."""
    import json
    import platform

    from ortlab import __version__
    from ortlab.envvars import cache_dir
    from ortlab.probe import PACKAGES, cached_report
    from ortlab.runner import default_root, runs

    where = (root or default_root()).resolve()
    report = cached_report()
    data = {
        "ortlab": __version__,
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": f"{platform.system()} {platform.machine()}",
        "runs_folder": str(where),
        "runs": len(runs(where)),
        "cache": str(cache_dir()),
        "packages": _versions(PACKAGES),
        "doctor": (
            {k: {"available": a.available, "slow": a.slow} for k, a in report.accelerations.items()} if report else None
        ),
        "doctor_probed_at": report.probed_at if report else None,
    }
    if json_out:
        print(json.dumps(data, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("ortlab", __version__)
    grid.add_row("runtime", f"Python {data['python']} ({data['platform']}): {data['executable']}")
    grid.add_row("runs", f"{where} ({data['runs']} runs)")
    ort_training = data["packages"].get("onnxruntime-training")
    grid.add_row("versions", ", ".join(f"{k} {v}" for k, v in data["packages"].items() if v) or "-")
    # onnxruntime-training is the ORT package here; the inference-only onnxruntime is not expected beside it.
    missing = [k for k, v in data["packages"].items() if not v and not (k == "onnxruntime" and ort_training)]
    if missing:
        grid.add_row("not installed", ", ".join(missing))
    if report:
        marks = ", ".join(
            f"{k} {'slow' if a.available and a.slow else 'yes' if a.available else 'no'}"
            for k, a in report.accelerations.items()
        )
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(report.probed_at)) if report.probed_at else "?"
        grid.add_row("doctor", f"{marks} (probed {when}; details: `ortlab doctor`)")
    else:
        grid.add_row("doctor", "not probed in this environment yet: run `ortlab doctor` (10-40 s, then cached)")
    grid.add_row("cache", data["cache"])
    Console(highlight=False).print(grid)


def _versions(packages: tuple[str, ...]) -> dict[str, str | None]:
    from ortlab.accel import package_version

    return {p: package_version(p) for p in packages}


@app.command()
def doctor(
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    python: Annotated[Path | None, typer.Option(help="probe another Python environment (its interpreter path)")] = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="probe again instead of answering from the cache")] = False,
) -> None:
    """What this environment can run: each acceleration, available or not, with the reason and the remedy.

    The answer is cached per environment (versions, extensions, CPU, GPUs); a changed environment is probed
    again by itself, --refresh forces it."""
    from ortlab.probe import doctor as run_doctor

    report = run_doctor(python=str(python) if python else None, refresh=refresh)
    if json_out:
        print(report.to_json())
    else:
        report.render()


@app.command("build-ort-extensions")
def build_ort_extensions(
    force: Annotated[bool, typer.Option(help="rebuild even if they look up to date")] = False,
) -> None:
    """Compile ORTModule's two CPU torch extensions into the installed onnxruntime-training (~3 min)."""
    from ortlab.accel.ort import build_extensions

    try:
        built = build_extensions(force=force)
    except RuntimeError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo("ORTModule extensions built" if built else "ORTModule extensions already built: nothing to do")


@app.command("bundle")
def bundle_command(
    out: Annotated[Path, typer.Option("--out", help="folder to collect the wheels in (created if missing)")],
    python: Annotated[
        str | None, typer.Option("--python", help="the target CPython, e.g. 3.12 (default: this one's)")
    ] = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="resolve against the index, not uv's cache of it")] = False,
) -> None:
    """Collect an offline wheelhouse: ortlab[ui] for an environment that already has torch, transformers, numpy,
    pandas and pyarrow (a GPU node's own CUDA torch is kept). Install there with
    `pip install --no-index --find-links DIR 'ortlab[ui]'`."""
    from ortlab.bundle import BundleError, bundle

    try:
        bundle(out, python, say=typer.echo, refresh=refresh)
    except BundleError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


runtime_app = typer.Typer(
    help="Second Python runtimes ortlab builds and launches runs in (compile: torch >= 2.7 for torch.compile).",
    no_args_is_help=True,
    **PLAIN_HELP,
)
app.add_typer(runtime_app, name="runtime")


@runtime_app.command("create")
def runtime_create(
    name: Annotated[str, typer.Argument(help="the runtime to build: compile")],
) -> None:
    """Build a runtime (about a minute with a local CPU torch wheel; nothing to do when it is ready).

    Runs that ask for torch_compile go to the compile runtime by themselves once it exists."""
    from ortlab.runtimes import RUNTIMES, RuntimeCreateError, create

    if name not in RUNTIMES:
        typer.echo(f"error: unknown runtime {name!r}; ortlab builds: {', '.join(RUNTIMES)}", err=True)
        raise typer.Exit(2)
    try:
        create(name, progress=lambda line: typer.echo(line))
    except RuntimeCreateError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


@runtime_app.command("list")
def runtime_list() -> None:
    """The runtimes ortlab builds, where each lives and whether it is ready (reads files only)."""
    from ortlab.runtimes import RUNTIMES, state_of

    for name, what in RUNTIMES.items():
        state = state_of(name)
        if state.python is not None and state.stamp:
            typer.echo(f"{name}: ready, torch {state.stamp.get('torch')} ({state.python}); {what}")
        else:
            typer.echo(f"{name}: not ready: {state.why}; {what}")


cluster_app = typer.Typer(
    help="A local Ray head to run remote runs on (`--cluster local`): loopback only, token authentication.",
    no_args_is_help=True,
    **PLAIN_HELP,
)
app.add_typer(cluster_app, name="cluster")


@cluster_app.command("start")
def cluster_start(
    num_cpus: Annotated[int | None, typer.Option(help="CPUs the head offers to jobs (default: all)")] = None,
    num_gpus: Annotated[int | None, typer.Option(help="GPUs the head offers to jobs (default: all)")] = None,
    new_token: Annotated[
        bool,
        typer.Option(
            "--new-token",
            help="replace the head's token before starting (the old one stops working); the head must be stopped",
        ),
    ] = False,
) -> None:
    """Start the local Ray head (or say where the running one is). Returns once it can run jobs."""
    from ortlab import cluster

    try:
        record = cluster.start(num_cpus=num_cpus, num_gpus=num_gpus, new_token=new_token)
    except cluster.ClusterError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"local Ray head running (pid {record['pid']}) at {record['address']}; train on it with --cluster local")
    typer.echo(f"its token is in {cluster.token_path()} (owner-only); runs' files go to {record['storage']}")


@cluster_app.command("status")
def cluster_status() -> None:
    """Is the local Ray head running (its recorded process, checked by PID and create time)?"""
    from ortlab import cluster

    record = cluster.status()
    if not record["running"]:
        typer.echo("no local Ray head is running (start one with `ortlab cluster start`)")
        raise typer.Exit(1)
    typer.echo(f"local Ray head running (pid {record['pid']}) at {record['address']}; storage {record['storage']}")


@cluster_app.command("stop")
def cluster_stop() -> None:
    """Stop the local Ray head that `ortlab cluster start` started (only its own processes)."""
    from ortlab import cluster

    typer.echo("local Ray head stopped" if cluster.stop() else "no local Ray head was running")


# The options that set a RunSpec field, `train`'s and `tune`'s alike: the option's parameter name -> the field's
# path. Each command builds its overrides from its own parameters with `_overrides(locals())`, so an option is
# mapped to the spec once, here. Values spelled otherwise on the command line are converted in SPEC_VALUES.
SPEC_OPTIONS: dict[str, tuple[str, ...]] = {
    "model": ("model", "name"),
    "data": ("data", "source"),
    "task": ("task",),
    "text_column": ("data", "text_column"),
    "label_column": ("data", "label_column"),
    "source_column": ("data", "source_column"),
    "target_column": ("data", "target_column"),
    "messages_column": ("data", "messages_column"),
    "prompt_column": ("data", "prompt_column"),
    "response_column": ("data", "response_column"),
    "packing": ("data", "packing"),
    "max_train_samples": ("data", "max_train_samples"),
    "max_eval_samples": ("data", "max_eval_samples"),
    "epochs": ("hyper", "epochs"),
    "max_steps": ("hyper", "max_steps"),
    "learning_rate": ("hyper", "learning_rate"),
    "batch_size": ("hyper", "batch_size"),
    "max_length": ("hyper", "max_length"),
    "max_target_length": ("hyper", "max_target_length"),
    "ort": ("accel", "ort"),
    "fused_adam": ("accel", "fused_adam"),
    "zero_stage": ("accel", "zero_stage"),
    "precision": ("accel", "precision"),
    "tune": ("accel", "tune"),
    "torch_compile": ("accel", "torch_compile"),
    "lora": ("adapter", "kind"),
    "adapter_rank": ("adapter", "rank"),
    "report_to": ("report_to",),
    "output_dir": ("output_dir",),
    "name": ("name",),
    "seed": ("seed",),
    "cluster": ("target", "cluster"),
}
SPEC_VALUES: dict[str, Any] = {
    "tune": lambda on: "measure" if on else None,
    "lora": lambda on: None if on is None else "lora" if on else "none",
    "report_to": lambda values: _names(values),
}


def _overrides(options: dict[str, Any]) -> dict[tuple[str, ...], Any]:
    """The spec fields a command's options set (None: not given), from its parameters (`locals()`)."""
    return {
        path: SPEC_VALUES.get(name, lambda v: v)(options[name])
        for name, path in SPEC_OPTIONS.items()
        if name in options
    }


# Declared once for both commands that take them.
SpecFile = Annotated[Path | None, typer.Argument(help="a RunSpec as YAML or JSON (default: the embedded default)")]
ModelOption = Annotated[str | None, typer.Option(help="Hub model id or local folder")]
DataOption = Annotated[str | None, typer.Option(help="Hub dataset id, local file/folder, or embedded:NAME")]
SourceColumnOption = Annotated[str | None, typer.Option(help="seq2seq: the input text column")]
TargetColumnOption = Annotated[str | None, typer.Option(help="seq2seq: the output text column")]


@app.command()
def train(
    spec_file: SpecFile = None,
    model: ModelOption = None,
    data: DataOption = None,
    task: Annotated[
        str | None, typer.Option(help="the task: sequence- or token-classification, causal-lm, or seq2seq")
    ] = None,
    text_column: Annotated[str | None, typer.Option()] = None,
    label_column: Annotated[str | None, typer.Option()] = None,
    source_column: SourceColumnOption = None,
    target_column: TargetColumnOption = None,
    messages_column: Annotated[
        str | None, typer.Option(help="causal-lm chat data: the column of {role, content} turns")
    ] = None,
    prompt_column: Annotated[str | None, typer.Option(help="causal-lm instruction data: the prompt column")] = None,
    response_column: Annotated[str | None, typer.Option(help="causal-lm instruction data: the answer column")] = None,
    packing: Annotated[
        bool | None, typer.Option("--packing/--no-packing", help="causal-lm chat data: pack short examples")
    ] = None,
    max_train_samples: Annotated[int | None, typer.Option()] = None,
    max_eval_samples: Annotated[int | None, typer.Option()] = None,
    epochs: Annotated[float | None, typer.Option()] = None,
    max_steps: Annotated[int | None, typer.Option()] = None,
    learning_rate: Annotated[float | None, typer.Option("--lr", "--learning-rate")] = None,
    batch_size: Annotated[int | None, typer.Option()] = None,
    max_length: Annotated[int | None, typer.Option()] = None,
    max_target_length: Annotated[int | None, typer.Option(help="seq2seq: target tokens (default: max length)")] = None,
    ort: Annotated[bool | None, typer.Option("--ort/--no-ort", help="ONNX Runtime training (default: auto)")] = None,
    fused_adam: Annotated[bool | None, typer.Option("--fused-adam/--no-fused-adam", help="(default: auto)")] = None,
    zero_stage: Annotated[int | None, typer.Option(help="DeepSpeed ZeRO stage")] = None,
    precision: Annotated[str | None, typer.Option(help="auto, fp32, fp16 or bf16")] = None,
    tune: Annotated[
        bool, typer.Option("--tune", help="measure which mix is fastest here first (about a minute; cached)")
    ] = False,
    torch_compile: Annotated[
        bool | None,
        typer.Option(
            "--torch-compile/--no-torch-compile",
            help="torch.compile the model (runs in ortlab's compile runtime when this one cannot compile)",
        ),
    ] = None,
    lora: Annotated[
        bool | None, typer.Option("--lora/--no-lora", help="train LoRA adapters (peft) instead of every weight")
    ] = None,
    adapter_rank: Annotated[int | None, typer.Option(help="LoRA rank (with --lora; default 8)")] = None,
    report_to: Annotated[
        list[str] | None,
        typer.Option(
            "--report-to",
            help="experiment tracker: trackio, tensorboard, mlflow or wandb (repeat it, or a comma list)",
        ),
    ] = None,
    output_dir: Annotated[str | None, typer.Option(help="folder for run folders (default: ortlab-runs)")] = None,
    name: Annotated[str | None, typer.Option(help="run name")] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    quiet: Annotated[bool, typer.Option(help="no progress bar")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="show every library's output (default: in the run's logs/run.log)")
    ] = False,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="run in the background; watch with `ortlab follow RUN`")
    ] = False,
    cluster: Annotated[
        str | None,
        typer.Option(
            help="run as a job on a Ray cluster: its Jobs address (http://HOST:8265), or 'local' for the head of "
            "`ortlab cluster start`"
        ),
    ] = None,
) -> None:
    """Train a RunSpec: checks everything first, then trains in the foreground (or detached) and prints eval
    before and after."""

    overrides = _overrides(locals())
    try:
        spec = _build_spec(spec_file, overrides)
        if adapter_rank is not None and spec.adapter.kind == "none":
            from ortlab.spec import SpecError

            raise SpecError(["adapter.rank: --adapter-rank sets the rank of a LoRA adapter; add --lora to train one"])
        # Another interpreter or several processes cannot train in this process: they are launched, and in the
        # foreground followed here, like a detached run.
        # So does a run that needs ortlab's compile runtime (torch_compile where this runtime cannot compile).
        from ortlab.fit import check
        from ortlab.runner import check as check_target
        from ortlab.runner import trains_here
        from ortlab.train.run import train_spec

        if detach or not trains_here(spec):
            check_target(spec)  # the machine first (the target's doctor, cached): seconds, before the data
            if spec.target.cluster is None:  # (a cluster run's model and data are checked on the cluster)
                check(spec)  # the same fast checks as in the foreground, before anything starts
            from ortlab.runner import default_root, launch

            run = launch(spec)
            root = Path(spec.output_dir)
            where = "" if root.resolve() == default_root().resolve() else f" --root {root}"
            if detach:
                typer.echo(f"launched {run.id} ({run.path}); watch it with: ortlab follow {run.id}{where}")
                return
            typer.echo(f"launched {run.id} ({run.path}); following it (Ctrl-C stops following, not the run)")
            try:
                follow(run.id, root=root)
            except KeyboardInterrupt:
                typer.echo(f"\nstill running: ortlab follow {run.id}{where}", err=True)
                raise typer.Exit(130) from None
            return
        from ortlab.train.terminal import Terminal

        with Terminal(verbose=verbose, progress=not quiet) as terminal:
            result = train_spec(spec, progress=not quiet, terminal=terminal)
    except KeyboardInterrupt:
        typer.echo("interrupted: the run is marked failed (its folder keeps what was written)", err=True)
        raise typer.Exit(130) from None
    _print_result(result)


def _names(values: list[str] | None) -> list[str] | None:
    """A repeatable option that also takes comma lists: `--report-to a,b --report-to c` -> [a, b, c]."""
    return None if values is None else [n for v in values for n in map(str.strip, v.split(",")) if n]


def _build_spec(spec_file: Path | None, overrides: dict[tuple[str, ...], Any]):
    """The spec file (or the embedded default) with the command line's options on top."""
    from ortlab.spec import RunSpec

    base = _read_spec_file(spec_file) if spec_file is not None else RunSpec().model_dump(mode="json")
    data = overrides.get(("data", "source"))
    if data is not None and spec_file is None:
        base["data"] = {"source": data}  # a new dataset starts from the data defaults, not the demo's caps
    for path, value in overrides.items():
        if value is None:
            continue
        node = base
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return RunSpec.parse(base)


@app.command("tune")
def tune_cmd(
    spec_file: SpecFile = None,
    model: ModelOption = None,
    data: DataOption = None,
    task: Annotated[str | None, typer.Option(help="the task")] = None,
    text_column: Annotated[str | None, typer.Option()] = None,
    label_column: Annotated[str | None, typer.Option()] = None,
    source_column: SourceColumnOption = None,
    target_column: TargetColumnOption = None,
    batch_size: Annotated[int | None, typer.Option()] = None,
    max_length: Annotated[int | None, typer.Option()] = None,
    cache: Annotated[bool, typer.Option("--cache/--no-cache", help="reuse an earlier measurement")] = True,
    compile: Annotated[
        bool, typer.Option("--compile", help="also measure torch.compile (its warm-up takes a minute or more)")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Measure which acceleration mix trains fastest here, on the spec's model and batches (about a minute).

    Runs that leave accelerations at 'auto' reuse the result (cached per model, shapes and machine)."""
    overrides = _overrides(locals())
    import json

    from ortlab.tune import tune_spec

    spec = _build_spec(spec_file, overrides)
    result = tune_spec(spec, progress=lambda m: typer.echo(m, err=json_out), use_cache=cache, compile=compile)
    if json_out:
        print(json.dumps(result.to_dict(), indent=2, default=str))
        return
    _print_tune(result)


def _print_tune(result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    table = Table(title=None)
    for col, justify in (("mix", "left"), ("samples/s", "right"), ("vs plain", "right"), ("warm-up", "right")):
        table.add_column(col, justify=justify, overflow="fold")
    table.add_column("verdict", overflow="fold")
    for m in result.candidates:
        table.add_row(
            m.name,
            _num(m.samples_per_s, ".1f"),
            _num(m.ratio, ".2f") + ("x" if m.ratio is not None else ""),
            _num(m.warmup_s, ".1f") + (" s" if m.warmup_s is not None else ""),
            m.verdict,
        )
    console.print(table)
    how = "cached measurement" if result.cached else f"measured in {result.calibration_s:.0f} s"
    console.print(f"fastest here: [bold]{result.chosen}[/] ({how}, {result.rounds} interleaved rounds)")
    if result.choice.get("torch_compile"):
        console.print("torch.compile is never chosen for you: set accel.torch_compile (--torch-compile) to use it")
    else:
        console.print("runs that leave ort / fused_adam / precision at 'auto' on this model and batch shape use it")


def _read_spec_file(path: Path) -> dict:
    import json

    import yaml

    from ortlab.spec import SpecError

    if not path.is_file():
        raise SpecError([f"spec file {str(path)!r} does not exist"])
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise SpecError([f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}"]) from None
    if not isinstance(data, dict):
        raise SpecError([f"{path}: a spec is a mapping of fields, got {type(data).__name__}"])
    return data


def _user_error(e: OrtlabError, code: int = 2) -> NoReturn:
    """An OrtlabError means 'your input or situation is wrong' (ortlab is not broken): `error: <message>` on stderr,
    no traceback, exit `code` (2 by default, as for a usage error). The message may quote a spec, a path or a run
    folder: control characters are removed and rich markup is escaped, so it prints as written."""
    from rich.console import Console
    from rich.markup import escape

    from ortlab.chat import strip_controls

    console = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)
    console.print(f"error: {escape(strip_controls(str(e)))}")  # uncoloured: `error: ` reads the same everywhere
    raise typer.Exit(code) from None


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


def _num(value: object, fmt: str) -> str:
    """A metric for a terminal line: NaN/inf (written as null) or a missing field shows as '-', never a crash."""
    import math

    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return format(value, fmt)
    return "-" if value is None else str(value)


RootOption = Annotated[
    Path | None, typer.Option(help="folder holding the runs (default: $ORTLAB_RUNS or ./ortlab-runs)")
]


def _attach(run_id: str, root: Path | None):
    from ortlab.runner import RunError, attach

    try:
        return attach(run_id, root)
    except RunError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


@app.command("runs")
def list_runs(root: RootOption = None) -> None:
    """The runs under the runs folder: state, step, what applied, throughput."""
    from ortlab.runfolder.compare import render_runs, row_for
    from ortlab.runner import default_root, runs

    render_runs([row_for(run.dir) for run in runs(root)], title=f"runs in {root or default_root()}")


@app.command()
def follow(
    run_id: Annotated[str, typer.Argument(help="run id or folder")],
    root: RootOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the raw JSON lines")] = False,
) -> None:
    """Print a run's metrics from the start, then live until it ends."""
    from ortlab.chat import strip_controls
    from ortlab.runner import RunError

    run = _attach(run_id, root)
    try:
        _follow_lines(run, json_out)
    except RunError as e:  # a status gone or damaged for a while: the reason, not a traceback
        typer.echo(f"error: {strip_controls(str(e))}", err=True)
        raise typer.Exit(2) from None
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
        elif r.get("event") == "step":
            print(
                f"step {r.get('step', '?'):>6}  loss {_num(r.get('loss'), '.4f')}  "
                f"{_num(r.get('samples_per_s'), '.1f')} samples/s  {_num(r.get('step_time_s'), '.2f')} s/step  "
                f"peak {_num(r.get('peak_mem_mb'), '.0f')} MB",
                flush=True,
            )
        elif r.get("event") == "eval":
            scores = format_scores(r)
            print(f"eval {r.get('phase', '')} (step {r.get('step')}): {scores}", flush=True)
        elif r.get("event") in ("acceleration", "stopped", "resume"):
            print(f"{r['event']}: {r.get('message') or r.get('checkpoint', '')}", flush=True)
        elif r.get("event") == "generations":
            from ortlab.chat import generation_lines

            for line in generation_lines(r):
                print(line, flush=True)


@app.command()
def stop(run_id: Annotated[str, typer.Argument(help="run id or folder")], root: RootOption = None) -> None:
    """Stop a run gracefully: it finishes its step, saves a checkpoint and ends `stopped`."""
    from ortlab.chat import strip_controls
    from ortlab.runner import RunError

    try:
        status = _attach(run_id, root).stop()
    except RunError as e:  # a damaged folder, or a process that is not the run's: nothing was signalled
        typer.echo(f"error: {strip_controls(str(e))}", err=True)
        raise typer.Exit(2) from None
    typer.echo(
        f"{run_id}: {status['state']}" + (f", checkpoint {status['checkpoint']}" if status.get("checkpoint") else "")
    )


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="run id or folder")],
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
) -> None:
    """Continue a stopped run from its last checkpoint (in the background; watch with `ortlab follow`)."""
    from ortlab.runner import RunError

    run = _attach(run_id, root)
    try:
        run.resume(python=python, cluster=cluster)
    except RunError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"resumed {run.id}; watch it with: ortlab follow {run.path}")


@app.command("compare")
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

    runs_ = [_attach(r, root) for r in run_ids]
    try:
        rows = compare([r.dir for r in runs_], baseline=baseline)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if json_out:
        print(json.dumps([asdict(r) for r in rows], indent=2, default=str))
    else:
        render(rows)


@app.command()
def export(
    run_id: Annotated[str, typer.Argument(help="a completed run (id or folder)")],
    root: RootOption = None,
    samples: Annotated[int, typer.Option(help="eval samples for the parity check")] = 64,
    optimize: Annotated[bool, typer.Option(help="also save ORT's offline-optimized graph")] = False,
    quantize: Annotated[bool, typer.Option(help="also save a dynamic int8 quantization")] = False,
) -> None:
    """Export a finished run to ONNX (<run>/onnx/), check parity with PyTorch and compare latency."""
    from rich.console import Console
    from rich.table import Table

    from ortlab.export import ExportError, export_onnx

    run = _attach(run_id, root)
    try:
        report = export_onnx(run.dir, samples=samples, optimize=optimize, quantize=quantize)
    except ExportError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    title = f"{run.id}: ONNX vs PyTorch on {report.samples} eval samples ({report.task})"
    if report.generation:  # seq2seq: latency is that of greedy generation, in both columns
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


@app.command()
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

    run = _attach(run_id, root)
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
    from ortlab.publish import PublishError, push_to_folder, push_to_git, push_to_hub

    try:
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
    except PublishError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    return str(where)


@app.command()
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
    try:
        out = run_notebook(path, output or path.with_suffix(".out.ipynb"), parameters)
    except OrtlabError as e:  # a cell that failed, a parameter the notebook lacks, a file that is no notebook
        _user_error(e, 1)
    typer.echo(f"executed: {out}")


@app.command()
def spec(
    schema: Annotated[bool, typer.Option("--schema", help="print the JSON schema instead of the default spec")] = False,
) -> None:
    """Print the default RunSpec as YAML (a starting point for your own), or its JSON schema."""
    import json

    from ortlab.spec import RunSpec

    print(json.dumps(RunSpec.json_schema(), indent=2) if schema else RunSpec().to_yaml())


def main() -> None:
    app(prog_name="ortlab")


if __name__ == "__main__":
    sys.exit(main())
