"""Fine-tune a sequence classifier on a CSV (text, label) with ONNX Runtime training."""

from dataclasses import dataclass, field

import numpy as np
from datasets import load_dataset
from optimum.onnxruntime import ORTTrainer, ORTTrainingArguments
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    HfArgumentParser,
    set_seed,
)


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "Path to pretrained model or model identifier"})


@dataclass
class DataTrainingArguments:
    train_file: str = field(metadata={"help": "A csv file with `text` and `label` columns."})
    validation_file: str | None = field(default=None)
    max_seq_length: int = field(default=128)
    max_train_samples: int | None = field(default=None)


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, ORTTrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    # Set seed before initializing model.
    set_seed(training_args.seed)

    files = {"train": data_args.train_file}
    if data_args.validation_file:
        files["validation"] = data_args.validation_file
    raw = load_dataset("csv", data_files=files)
    labels = sorted(set(raw["train"]["label"]))
    label_to_id = {v: i for i, v in enumerate(labels)}

    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForSequenceClassification.from_pretrained(model_args.model_name_or_path, num_labels=len(labels))

    def preprocess(examples):
        result = tokenizer(examples["text"], truncation=True, max_length=data_args.max_seq_length)
        result["label"] = [label_to_id[v] for v in examples["label"]]
        return result

    raw = raw.map(preprocess, batched=True, remove_columns=["text"])
    train_dataset = raw["train"]
    if data_args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(data_args.max_train_samples))
    eval_dataset = raw.get("validation")

    def compute_metrics(p):
        preds = np.argmax(p.predictions, axis=1)
        return {"accuracy": float((preds == p.label_ids).mean())}

    trainer = ORTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset if training_args.do_train else None,
        eval_dataset=eval_dataset if training_args.do_eval else None,
        compute_metrics=compute_metrics,
        tokenizer=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
        feature="sequence-classification",
    )

    if training_args.do_train:
        train_result = trainer.train()
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        metrics = trainer.evaluate(eval_dataset=eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main()
