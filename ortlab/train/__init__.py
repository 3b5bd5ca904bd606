"""Training: `ORTTrainingArguments` and `ORTTrainer` (imports transformers: load lazily via `ortlab.ORTTrainer`)."""
