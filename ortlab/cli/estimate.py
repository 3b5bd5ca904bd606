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
    budget_minutes: Annotated[
        float | None, typer.Option(help="fit the run to this many minutes (chooses max_steps)")
    ] = None,
    budget_memory_gb: Annotated[
        float | None,
        typer.Option(help="fit the run to this peak memory per process (checkpointing, batch, max_length)"),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the estimate as JSON")] = False,
) -> None:
    """Predict a run's peak memory per process, time per step and in all, and cost, before launching it (about a
    second: no model weights load). Every term with its range and what it rests on."""
    own = ("device", "price_per_hour", "json_out", "budget_minutes", "budget_memory_gb")
    given = overrides({k: v for k, v in locals().items() if k not in own})
    from ortlab.estimator import estimate

    chosen: list[str] = []
    with reported():
        spec = build_spec(spec_file, given)
        if budget_minutes is not None or budget_memory_gb is not None:
            from ortlab.estimator.budget import fit_budget

            fitted = fit_budget(spec, minutes=budget_minutes, memory_gb=budget_memory_gb, device=device)
            spec, chosen = fitted.spec, fitted.choices
        est = estimate(spec, device=device, price_per_hour=price_per_hour)
    if json_out:
        import json

        fitted_hyper = spec.hyper.model_dump(mode="json") if chosen else None
        print(json.dumps({**est.to_dict(), "budget": {"choices": chosen, "hyper": fitted_hyper}}, indent=2))
        return
    typer.echo(est.table())
    if budget_minutes is not None or budget_memory_gb is not None:
        typer.echo("")
        typer.echo("fitted to the budget:" if chosen else "fits the budget as it is")
        import textwrap

        for line in chosen:
            typer.echo(textwrap.fill(line, 80, initial_indent="  - ", subsequent_indent="    "))
    if est.fits is False:
        from ortlab.estimator.fits import refusal

        typer.echo("")
        typer.echo(refusal(spec, est, device))
        raise typer.Exit(1)
