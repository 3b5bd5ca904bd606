"""Preference training (DPO, IPO, ORPO, KTO) of a causal LM: pairs of a chosen and a rejected answer to a prompt
(strings, message lists, UltraFeedback conversations) or KTO's answers labelled good or bad, every row checked before
any model loads (`ortlab.data.pairchecks`), trained by `ortlab.train.preferencetrainer.PreferenceTrainer`, scored
on held-out pairs by preference accuracy and reward margin.

Its own task rather than a `method` of causal-lm: what the data is, how it is checked, tokenized and collated, the
trainer, its scores and its settings all differ from SFT's; the model head is the only thing it shares, and a task
record names the head (`feature`). See docs/decisions/tasks.md."""

from ortlab.tasks.task import Feature, Task

TASK = Task(
    name="preference",
    description="align a causal LM on preferred / rejected answers (DPO, IPO, ORPO, KTO)",
    feature=Feature("causal-lm", "AutoModelForCausalLM", ("ForCausalLM", "LMHeadModel")),
    peft_task_type="CAUSAL_LM",
    pipeline_tag="text-generation",
    short="pref",
    head_table="MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    lm_head=True,
    columns=(),  # the shape and its columns are found (`ortlab.data.pairs.propose_pairs_mapping`)
    pairs=True,
    tokenize="ortlab.data.pairtokens:tokenize_prepared",
    collate="ortlab.train.preferencebatch:collator_for",
    trainer="ortlab.train.preferencetrainer:PreferenceTrainer",
    arguments="ortlab.train.preferencetrainer:PreferenceTrainingArguments",
    argmax=False,  # its trainer's evaluation returns the pair scores itself
    headline=("eval_rewards/accuracies", "eval_rewards/margins"),
    lm_rows="ortlab.data.pairtokens:lm_rows",  # the exports check on the prompt with the chosen answer
    exports=("onnx", "gguf"),  # its model is a causal LM: it exports as a causal-lm run's does
    form=("preference.loss", "preference.beta", "preference.reference"),
)
