"""One rank of a several-process run that records which rows its trainer trained on: `python -m
ortlab.runner.torchrun --nproc_per_node=N tests/helpers/stream_rank_rows.py RUN_DIR OUT_DIR`.

The run is ortlab's own (`execute`, as `python -m ortlab.lifecycle` runs it). Two records per rank: the rows that
reached the model (the trainer's `training_step` wrapped to decode its batch) and the texts this process
tokenized itself (the tokenizer's `__call__` wrapped): a process that only receives batches sent by rank 0
tokenizes no training row."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from ortlab.lifecycle.execute import execute
from ortlab.runfolder.rundir import RunDir
from ortlab.train.trainer import ORTTrainer

seen: list[list[str]] = []
read: list[str] = []
original = ORTTrainer.training_step
original_call = PreTrainedTokenizerBase.__call__


def reading(tokenizer, text=None, *args, **kwargs):
    if isinstance(text, list):
        read.extend(t.replace(" ", "") for t in text if isinstance(t, str))
    return original_call(tokenizer, text, *args, **kwargs)


def recording(self, model, inputs, *args, **kwargs):
    texts = self.processing_class.batch_decode(inputs["input_ids"].tolist(), skip_special_tokens=True)
    seen.append([t.replace(" ", "").replace("##", "") for t in texts])  # "review 12" may decode as "review 1 ##2"
    return original(self, model, inputs, *args, **kwargs)


ORTTrainer.training_step = recording
PreTrainedTokenizerBase.__call__ = reading
execute(RunDir(Path(sys.argv[1])), resume=False, progress=False)
Path(sys.argv[2], f"rank-{os.environ['RANK']}.json").write_text(json.dumps({"trained": seen, "read": read}))
