"""Sequence to sequence: a source text to a target text (translation, summarisation) with an encoder-decoder model,
scored by generating the target (or teacher-forced)."""

from ortlab.tasks.task import Feature, Task

TASK = Task(
    name="seq2seq",
    description="a source text to a target text (encoder-decoder models)",
    # T5ForConditionalGeneration, BartForConditionalGeneration, MarianMTModel, ... (the head is checked by
    # config.is_encoder_decoder: the class names vary too much)
    feature=Feature("seq2seq-lm", "AutoModelForSeq2SeqLM", ("ForConditionalGeneration", "MTModel")),
    peft_task_type="SEQ_2_SEQ_LM",
    pipeline_tag="text2text-generation",
    short="s2s",
    head_table=None,
    lm_head=True,
    columns=("source_column", "target_column"),
    target=True,
    rows="ortlab.data.inputs:seq2seq_rows",
    collate="ortlab.data.inputs:seq2seq_collator",
    metrics="ortlab.scores:seq2seq_task_metrics",
    trainer="ortlab.train.seq2seq:ORTSeq2SeqTrainer",
    arguments="ortlab.train.seq2seq:ORTSeq2SeqTrainingArguments",
    generates=True,
    headline=("eval_exact_match", "eval_token_f1", "eval_token_accuracy"),
    exports=("onnx", "onnx-encoder-decoder"),
    form=("data.source_column", "data.target_column", "generation.predict_with_generate"),
)
