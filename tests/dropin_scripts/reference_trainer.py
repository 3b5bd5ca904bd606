"""Plain `transformers.Trainer` under Optimum's names, for the reference runs of tests/test_dropin_scripts.py.

Renames only (`tokenizer=` is transformers 5's `processing_class=`; `feature=` has no meaning for Trainer):
everything else is transformers' own Trainer, so a reference run trains what plain transformers trains.
"""

from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer, TrainingArguments

ORTTrainingArguments = TrainingArguments
ORTSeq2SeqTrainingArguments = Seq2SeqTrainingArguments


class ORTTrainer(Trainer):
    def __init__(self, *args, tokenizer=None, feature=None, **kwargs):
        super().__init__(*args, processing_class=tokenizer, **kwargs)


class ORTSeq2SeqTrainer(Seq2SeqTrainer):
    def __init__(self, *args, tokenizer=None, feature=None, **kwargs):
        super().__init__(*args, processing_class=tokenizer, **kwargs)
