"""`PermutationSampler`: the training order of a one-process run, without a Python list as long as the dataset.

Why: accelerate replaces the Trainer's `RandomSampler` by its `SeedableRandomSampler`, whose iteration is torch's:
`torch.randperm(n).tolist()`, a list of n Python ints held for the whole epoch (36 bytes a row: 130 MB for a
3.6M-row training split). This sampler yields the very same indices, in the same order, epoch by epoch (the
same generator, seeded the same way: `data_seed`, else torch's initial seed, plus the epoch), from the
permutation tensor (8 bytes a row), a slice at a time. It is not a `RandomSampler`, so accelerate leaves it as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

SLICE = 65_536  # indices turned into Python ints at a time


class PermutationSampler:
    """Each epoch, a permutation of `range(n)`: `SeedableRandomSampler`'s for the same seed and epoch."""

    def __init__(self, n: int, data_seed: int | None = None) -> None:
        import torch

        self.n = n
        self.initial_seed = data_seed if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def __len__(self) -> int:
        return self.n

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        import torch

        generator = torch.Generator()
        generator.manual_seed(self.initial_seed + self.epoch)
        order = torch.randperm(self.n, generator=generator)
        for start in range(0, self.n, SLICE):
            yield from order[start : start + SLICE].tolist()
        self.set_epoch(self.epoch + 1)  # as SeedableRandomSampler does once an epoch is read to its end


def lean_train_sampler(sampler: Any, dataset: Any, args: Any) -> Any:
    """`sampler` (what `Trainer._get_train_sampler` chose), or a PermutationSampler where it is a plain
    `RandomSampler` that accelerate would make seedable in a one-process run (the order is the same)."""
    from torch.utils.data import RandomSampler

    seedable = getattr(getattr(args, "accelerator_config", None), "use_seedable_sampler", True)
    plain = type(sampler) is RandomSampler and not sampler.replacement and sampler.num_samples == len(dataset)
    if not plain or not seedable or args.world_size > 1:
        return sampler
    return PermutationSampler(len(dataset), args.data_seed)
