"""`ORTSeq2SeqTrainer` / `ORTSeq2SeqTrainingArguments`: encoder-decoder models (T5, BART, Marian) under ORTModule.

The same trainer as `ORTTrainer`, with transformers' `Seq2SeqTrainer` behind it: training runs inside ORTModule
(the encoder, the decoder and the loss, computed from labels the model shifts into `decoder_input_ids` itself);
`predict_with_generate` generates in PyTorch on the trained weights (`generation_max_length`,
`generation_num_beams`, `generation_config`), as Optimum's did: generation is a Python loop around the model that
an exported graph cannot hold. Labels are padded with -100, as `DataCollatorForSeq2Seq` does, so padding is left
out of the loss in both engines.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

from ortlab.train.args import ORTTrainingArguments
from ortlab.train.compat import accepts_optimum_era_arguments
from ortlab.train.trainer import ORTTrainer

__all__ = ["ORTSeq2SeqTrainer", "ORTSeq2SeqTrainingArguments"]


@accepts_optimum_era_arguments
@dataclass
class ORTSeq2SeqTrainingArguments(ORTTrainingArguments, Seq2SeqTrainingArguments):
    """`ORTTrainingArguments` plus `Seq2SeqTrainingArguments`' fields (`predict_with_generate`,
    `generation_max_length`, `generation_num_beams`, `generation_config`, `sortish_sampler`)."""


class ORTSeq2SeqTrainer(ORTTrainer, Seq2SeqTrainer):
    """Drop-in for Optimum's `ORTSeq2SeqTrainer`: `evaluate(...)` and `predict(...)` take Seq2SeqTrainer's
    generation arguments (`max_length`, `num_beams`, other `generate` keywords)."""

    _args_class = ORTSeq2SeqTrainingArguments
