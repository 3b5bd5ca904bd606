"""Sequence classification: a label per text (or text pair): sentiment, topic, entailment."""

from ortlab.tasks.task import Feature, Task

TASK = Task(
    name="sequence-classification",
    description="a label per text (or pair of texts)",
    feature=Feature("sequence-classification", "AutoModelForSequenceClassification", ("ForSequenceClassification",)),
    peft_task_type="SEQ_CLS",
    pipeline_tag="text-classification",
    short="cls",
    head_table="MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    columns=("text_column", "text_pair_column", "label_column"),
    labels="row",
    rows="ortlab.data.inputs:sequence_rows",
    collate="ortlab.data.inputs:padding_collator",
    metrics="ortlab.scores:sequence_metrics",
    headline=("eval_accuracy", "eval_f1"),
    form=("data.text_column", "data.text_pair_column", "data.label_column"),
)
