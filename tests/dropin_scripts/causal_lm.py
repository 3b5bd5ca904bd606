"""Fine-tune a causal language model on a text file with ONNX Runtime training (grouped into blocks)."""

import math
from dataclasses import dataclass, field
from itertools import chain

from datasets import load_dataset
from optimum.onnxruntime import ORTTrainer, ORTTrainingArguments
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, default_data_collator, set_seed


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "Path to pretrained model or model identifier"})


@dataclass
class DataTrainingArguments:
    train_file: str = field(metadata={"help": "A text file."})
    block_size: int = field(default=32)
    max_train_samples: int | None = field(default=None)


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, ORTTrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    # Set seed before initializing model.
    set_seed(training_args.seed)

    raw = load_dataset("text", data_files={"train": data_args.train_file})
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)

    tokenized = raw.map(lambda examples: tokenizer(examples["text"]), batched=True, remove_columns=["text"])
    block_size = data_args.block_size

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples}
        total_length = (len(concatenated["input_ids"]) // block_size) * block_size
        result = {
            k: [t[i : i + block_size] for i in range(0, total_length, block_size)] for k, t in concatenated.items()
        }
        result["labels"] = result["input_ids"].copy()
        return result

    lm_datasets = tokenized.map(group_texts, batched=True)
    train_dataset = lm_datasets["train"]
    if data_args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(data_args.max_train_samples))

    trainer = ORTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=train_dataset.select(range(8)) if training_args.do_eval else None,
        tokenizer=tokenizer,
        data_collator=default_data_collator,
        feature="causal-lm",
    )

    train_result = trainer.train()
    trainer.save_model()
    trainer.log_metrics("train", train_result.metrics)
    trainer.save_metrics("train", train_result.metrics)
    trainer.save_state()
    if training_args.do_eval:
        metrics = trainer.evaluate()
        metrics["perplexity"] = math.exp(metrics["eval_loss"])
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main()
