"""Train a tiny BERT under torch.compile on batches of varying length; print what Dynamo compiled as JSON.

Run with the compile runtime's Python (torch >= 2.7): `python compile_shapes.py MODEL_DIR OUT_DIR MULTIPLE`.
The backend is Dynamo's "eager" (no Inductor code generation): recompilation is Dynamo's decision, taken on the
guards of each new input shape whatever the backend, and this keeps the test to seconds.
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from ortlab.data import collator
from ortlab.train.args import ORTTrainingArguments
from ortlab.train.trainer import ORTTrainer

model_dir, out_dir, multiple = sys.argv[1], sys.argv[2], int(sys.argv[3]) or None
tokenizer = AutoTokenizer.from_pretrained(model_dir)
config = BertConfig.from_pretrained(model_dir, num_labels=2)
torch.manual_seed(0)
model = BertForSequenceClassification(config)
# Ten lengths between 5 and 30 tokens: one batch per step, each batch of one length.
rows = [{"input_ids": list(range(5, 5 + n)), "labels": n % 2} for n in (5, 9, 13, 17, 21, 25, 30, 7, 11, 19)]
seen: list[int] = []
pad = collator("sequence-classification", tokenizer, pad_to_multiple_of=multiple)


def collate(batch):
    out = pad(batch)
    seen.append(int(out["input_ids"].shape[1]))
    return out


args = ORTTrainingArguments(
    output_dir=out_dir, use_ort=False, torch_compile=True, torch_compile_backend="eager", max_steps=len(rows),
    per_device_train_batch_size=1, report_to=[], save_strategy="no", disable_tqdm=True, dataloader_drop_last=False,
)  # fmt: skip
trainer = ORTTrainer(model=model, args=args, train_dataset=rows, data_collator=collate)
trainer.train()
record = trainer.accelerations["torch_compile"].to_dict()
print("COMPILE-SHAPES " + json.dumps({"lengths": seen, "torch_compile": record}))
