"""Token classification: a tag per word (named entities, parts of speech), the words given as lists."""

from ortlab.tasks.task import Feature, Task

TASK = Task(
    name="token-classification",
    description="a tag per word (BIO entities): word lists and their tags",
    feature=Feature("token-classification", "AutoModelForTokenClassification", ("ForTokenClassification",)),
    peft_task_type="TOKEN_CLS",
    pipeline_tag="token-classification",
    short="tok",
    head_table="MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    columns=("text_column", "label_column"),
    labels="word",
    words=True,
    rows="ortlab.data.inputs:token_rows",
    collate="ortlab.data.inputs:token_collator",
    metrics="ortlab.scores:token_metrics",
    headline=("eval_f1", "eval_token_accuracy"),
    form=("data.text_column", "data.label_column"),
)
