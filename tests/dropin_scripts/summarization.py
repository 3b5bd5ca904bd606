"""Fine-tune an encoder-decoder model for summarization with ONNX Runtime training; evaluate with generate."""

from dataclasses import dataclass, field

from datasets import load_dataset
from optimum.onnxruntime import ORTSeq2SeqTrainer, ORTSeq2SeqTrainingArguments
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, HfArgumentParser, set_seed


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "Path to pretrained model or model identifier"})


@dataclass
class DataTrainingArguments:
    train_file: str = field(metadata={"help": "A json lines file with `text` and `summary` fields."})
    text_column: str = field(default="text")
    summary_column: str = field(default="summary")
    max_source_length: int = field(default=64)
    max_target_length: int = field(default=16)
    source_prefix: str | None = field(default="summarize: ")
    ignore_pad_token_for_loss: bool = field(default=True)


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, ORTSeq2SeqTrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    # Set seed before initializing model.
    set_seed(training_args.seed)

    raw = load_dataset("json", data_files={"train": data_args.train_file})
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path)
    prefix = data_args.source_prefix or ""

    def preprocess_function(examples):
        inputs = [prefix + text for text in examples[data_args.text_column]]
        model_inputs = tokenizer(inputs, max_length=data_args.max_source_length, truncation=True)
        labels = tokenizer(
            text_target=examples[data_args.summary_column], max_length=data_args.max_target_length, truncation=True
        )
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    train_dataset = raw["train"].map(preprocess_function, batched=True, remove_columns=raw["train"].column_names)
    label_pad_token_id = -100 if data_args.ignore_pad_token_for_loss else tokenizer.pad_token_id
    data_collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=label_pad_token_id)

    trainer = ORTSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=train_dataset.select(range(8)),
        tokenizer=tokenizer,
        data_collator=data_collator,
        feature="seq2seq-lm",
    )

    train_result = trainer.train()
    trainer.save_model()
    trainer.save_metrics("train", train_result.metrics)
    trainer.save_state()
    if training_args.predict_with_generate:
        predict_results = trainer.predict(train_dataset.select(range(4)), metric_key_prefix="predict")
        predictions = tokenizer.batch_decode(predict_results.predictions, skip_special_tokens=True)
        with open(f"{training_args.output_dir}/generated_predictions.txt", "w") as writer:
            writer.write("\n".join(p.strip() for p in predictions))


if __name__ == "__main__":
    main()
