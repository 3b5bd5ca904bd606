"""Each process of a several-process run reads its own part of a stream (`for_process`), with datasets' own
`split_dataset_by_node`; the trainer then keeps that split as it is (`ortlab.train.shardloader`)."""

from __future__ import annotations

from typing import Any


def for_process(stream: Any, rank: int, world_size: int, held_out_head: bool) -> Any:
    """This process's part of the training stream `stream` (a datasets IterableDataset) of a run of `world_size`
    processes; the stream itself when there is one process.

    By files ("shards") when the stream's files divide evenly between the processes: each process reads only its
    own files, so no row is read twice. By rows ("examples", every process keeps one row in `world_size` of the
    same seeded order) otherwise, and whenever the stream starts after a held-out head (`held_out_head`: the first
    rows were kept for evaluation with `skip`): split by files, datasets would share that skip out between the
    files (the rows skipped in the second file would be lost, and the eval rows of the first trained on), and the
    row positions that name a bad row would count within each process's files. Split by rows, every process
    reads the stream (and tokenizes it: datasets applies the split outside the map), which costs what a
    dispatching rank 0 costs, and the global batch of a step is the stream's next batch x processes rows."""
    if world_size <= 1:
        return stream
    from datasets.distributed import split_dataset_by_node

    by_files = not held_out_head and stream.num_shards % world_size == 0
    return split_dataset_by_node(stream, rank, world_size, strategy="shards" if by_files else "examples")
