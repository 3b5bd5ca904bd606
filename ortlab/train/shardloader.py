"""`OwnShardLoader`: a Trainer seam so that each process of a several-process run trains on its own part of a
stream that was already split per process (`datasets.distributed.split_dataset_by_node`), as it was split.

Why a seam: Accelerate splits every iterable dataset of a several-process run itself, whatever was done before.
By default it dispatches (rank 0 reads every process's batch and sends it); with dispatching off, it shards the
stream again (`IterableDataset.shard` by files, or every process keeps its slice of each global batch), so a
stream split by node would be split twice and train on a quarter of its rows at two processes. A stream that
datasets already marks as split (`_distributed`) is prepared here as one process's loader: batches of
`per_device_train_batch_size` of this process's rows, on this process's device."""

from __future__ import annotations

from typing import Any


def split_per_process(dataset: Any) -> bool:
    """Whether `dataset` is a datasets stream already split between processes (by `split_dataset_by_node`)."""
    return getattr(dataset, "_distributed", None) is not None and not hasattr(dataset, "__len__")


class OwnShardLoader:
    """Mixed into `transformers.Trainer` (before it): the training loader of a stream split per process."""

    def get_train_dataloader(self) -> Any:
        dataset = getattr(self, "train_dataset", None)
        if not split_per_process(dataset) or self.args.world_size <= 1:
            return super().get_train_dataloader()
        from accelerate.data_loader import prepare_data_loader
        from torch.utils.data import DataLoader

        args = self.args
        workers = args.dataloader_num_workers
        loader = DataLoader(
            dataset,
            batch_size=self._train_batch_size,
            collate_fn=self._get_collator_with_removed_columns(self.data_collator, description="Training"),
            num_workers=workers,
            pin_memory=args.dataloader_pin_memory,
            persistent_workers=args.dataloader_persistent_workers if workers else False,
            prefetch_factor=args.dataloader_prefetch_factor if workers else None,
        )
        # One process's loader: no further split, no dispatch; batches go to this process's device.
        prepared = prepare_data_loader(
            loader,
            self.accelerator.device,
            num_processes=1,
            process_index=0,
            put_on_device=True,
            dispatch_batches=False,
        )
        self.accelerator._dataloaders.append(prepared)  # as accelerator.prepare keeps it (state saving, skips)
        return prepared
