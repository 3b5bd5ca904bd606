"""The commands about this environment: `info`, `doctor`, `build-ort-extensions`, `bundle`, `runtime`, `cluster`."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ortlab.cli.common import PLAIN_HELP, reported


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


def doctor_command(
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    python: Annotated[Path | None, typer.Option(help="probe another Python environment (its interpreter path)")] = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="probe again instead of answering from the cache")] = False,
) -> None:
    """What this environment can run: each acceleration, available or not, with the reason and the remedy.

    The answer is cached per environment (versions, extensions, CPU, GPUs); a changed environment is probed
    again by itself, --refresh forces it."""
    from ortlab.probe import doctor

    report = doctor(python=str(python) if python else None, refresh=refresh)
    if json_out:
        print(report.to_json())
    else:
        report.render()


def build_ort_extensions(
    force: Annotated[bool, typer.Option(help="rebuild even if they look up to date")] = False,
) -> None:
    """Compile ORTModule's two CPU torch extensions into the installed onnxruntime-training (~3 min; seconds when
    ortlab's cache holds a build for the same torch, ORT, Python, compiler and sources)."""
    from ortlab.accel.ort import build_extensions

    with reported(RuntimeError, code=1):
        built = build_extensions(force=force)
    typer.echo("ORTModule extensions ready" if built else "ORTModule extensions already built: nothing to do")


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
    from ortlab.bundle import bundle

    with reported(code=1):
        bundle(out, python, say=typer.echo, refresh=refresh)


runtime_app = typer.Typer(
    help="Second Python runtimes ortlab builds and launches runs in (compile: torch >= 2.7 for torch.compile).",
    no_args_is_help=True,
    **PLAIN_HELP,
)


@runtime_app.command("create")
def runtime_create(
    name: Annotated[str, typer.Argument(help="the runtime to build: compile")],
) -> None:
    """Build a runtime (about a minute with a local CPU torch wheel; nothing to do when it is ready).

    Runs that ask for torch_compile go to the compile runtime by themselves once it exists."""
    from ortlab.runtimes import RUNTIMES, create

    if name not in RUNTIMES:
        typer.echo(f"error: unknown runtime {name!r}; ortlab builds: {', '.join(RUNTIMES)}", err=True)
        raise typer.Exit(2)
    with reported(code=1):
        create(name, progress=lambda line: typer.echo(line))


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


@cluster_app.command("start")
def cluster_start(
    num_cpus: Annotated[int | None, typer.Option(help="CPUs each node offers to jobs (default: all)")] = None,
    num_gpus: Annotated[int | None, typer.Option(help="GPUs each node offers to jobs (default: all)")] = None,
    nodes: Annotated[
        int | None,
        typer.Option(help="nodes on this machine, the head included: try multi-node runs (Ray Train workers)"),
    ] = None,
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

    with reported():
        record = cluster.start(num_cpus=num_cpus, num_gpus=num_gpus, new_token=new_token, nodes=nodes)
    workers = len(record.get("nodes") or [])
    typer.echo(
        f"local Ray head running (pid {record['pid']}) at {record['address']}"
        + (f" with {workers} worker node(s)" if workers else "")
        + "; train on it with --cluster local"
    )
    typer.echo(f"its token is in {cluster.token_path()} (owner-only); runs' files go to {record['storage']}")


@cluster_app.command("status")
def cluster_status() -> None:
    """Is the local Ray head running (its recorded process, checked by PID and create time)?"""
    from ortlab import cluster

    record = cluster.status()
    left = record["leftovers"]
    if left:  # a head or node that ended left processes of its own running (listeners included)
        typer.echo(
            f"{len(left)} process(es) of an ended head or worker node are still running (pid "
            f"{', '.join(map(str, left))}): end them with `ortlab cluster stop`"
        )
    if not record["running"]:
        typer.echo("no local Ray head is running (start one with `ortlab cluster start`)")
        raise typer.Exit(1)
    nodes = record["nodes"]
    alive = sum(node["running"] for node in nodes)
    typer.echo(
        f"local Ray head running (pid {record['pid']}) at {record['address']}"
        + (f", {alive} of {len(nodes)} worker node(s) running" if nodes else "")
        + f"; storage {record['storage']}"
    )


@cluster_app.command("stop")
def cluster_stop() -> None:
    """Stop the local Ray head that `ortlab cluster start` started: every process it started, none other."""
    from ortlab import cluster

    typer.echo("local Ray head stopped" if cluster.stop() else "no local Ray head was running")


# The options that set a RunSpec field, `train`'s and `tune`'s alike: the option's parameter name -> the field's
