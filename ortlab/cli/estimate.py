"""`ortlab estimate`: a run's predicted memory, time and cost before Launch (`ortlab.estimator`), as a table."""

from __future__ import annotations

from typing import Annotated

import typer

from ortlab.cli.common import reported
from ortlab.cli.options import SpecFile, build_spec, overrides, spec_option


def estimate_cmd(
    spec_file: SpecFile = None,
    model: Annotated[str | None, spec_option("model")] = None,
    data: Annotated[str | None, spec_option("data")] = None,
    task: Annotated[str | None, spec_option("task")] = None,
    text_column: Annotated[str | None, spec_option("text_column")] = None,
    messages_column: Annotated[str | None, spec_option("messages_column")] = None,
    max_train_samples: Annotated[int | None, spec_option("max_train_samples")] = None,
    epochs: Annotated[float | None, spec_option("epochs")] = None,
    max_steps: Annotated[int | None, spec_option("max_steps")] = None,
    batch_size: Annotated[int | None, spec_option("batch_size")] = None,
    max_length: Annotated[int | None, spec_option("max_length")] = None,
    gradient_checkpointing: Annotated[bool | None, spec_option("gradient_checkpointing")] = None,
    fused_adam: Annotated[bool | None, spec_option("fused_adam")] = None,
    zero_stage: Annotated[int | None, spec_option("zero_stage")] = None,
    precision: Annotated[str | None, spec_option("precision")] = None,
    lora: Annotated[bool | None, spec_option("lora")] = None,
    adapter_rank: Annotated[int | None, spec_option("adapter_rank")] = None,
    processes: Annotated[int | None, spec_option("processes")] = None,
    device: Annotated[
        str | None,
        typer.Option(
            help="estimate for this device instead of this machine: cpu, or a GPU (T4, L4, A10G, A100 40GB, "
            "A100 80GB, H100 SXM, H200)"
        ),
    ] = None,
    price_per_hour: Annotated[
        float | None, typer.Option(help="the machine's price per hour, for the run's cost")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the estimate as JSON")] = False,
) -> None:
    """Predict a run's peak memory per process, time per step and in all, and cost, before launching it (about a
    second: no model weights load). Every term with its range and what it rests on."""
    given = overrides({k: v for k, v in locals().items() if k not in ("device", "price_per_hour", "json_out")})
    from ortlab.estimator import estimate

    with reported():
        spec = build_spec(spec_file, given)
        est = estimate(spec, device=device, price_per_hour=price_per_hour)
    if json_out:
        import json

        print(json.dumps(est.to_dict(), indent=2))
        return
    typer.echo(est.table())
    if est.fits is False:
        from ortlab.estimator.fits import refusal

        typer.echo("")
        typer.echo(refusal(spec, est, device))
        raise typer.Exit(1)
