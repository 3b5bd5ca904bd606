"""Causal language modelling: plain text cut into blocks, or chat/instruction data templated with the model's chat
template (loss on the assistant's tokens), optionally packed; a few generations shown at each evaluation."""

from ortlab.tasks.task import Feature, Task

TASK = Task(
    name="causal-lm",
    description="next-token prediction on text, or chat / instruction data (SFT)",
    feature=Feature("causal-lm", "AutoModelForCausalLM", ("ForCausalLM", "LMHeadModel")),
    peft_task_type="CAUSAL_LM",
    pipeline_tag="text-generation",
    short="clm",
    head_table="MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    lm_head=True,
    columns=("text_column", "messages_column", "prompt_column", "response_column"),
    blocks=True,
    chat=True,
    rows="ortlab.data.inputs:block_rows",
    collate="ortlab.data.inputs:block_collator",
    argmax=False,  # scored by its loss (perplexity): no predictions kept
    perplexity=True,
    answers_prompts=True,
    headline=("eval_exact_match", "eval_perplexity"),
    exports=("onnx", "gguf"),
    form=("data.text_column", "data.messages_column", "data.prompt_column", "data.response_column", "data.packing"),
)
