"""ORTSeq2SeqTrainer: tiny T5 and BART (built from configs) trained under ORTModule, generation in PyTorch."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_bart, tiny_t5

PARITY = 2e-3


class Pairs(torch.utils.data.Dataset):
    """Source sequences of varying length; the target is the source's first tokens reversed (learnable)."""

    def __init__(self, n: int = 32, vocab: int = 200, offset: int = 0):
        self.n, self.vocab, self.offset = n, vocab, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i + self.offset)
        length = 6 + i % 7
        src = torch.randint(10, self.vocab, (length,), generator=g).tolist()
        tgt = list(reversed(src[: 2 + i % 4]))
        return {"input_ids": src, "attention_mask": [1] * length, "labels": tgt}


@pytest.fixture(scope="module")
def tokenizer(tiny_bert):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_bert)


def fit(make, tokenizer, use_ort: bool, tmp_path, steps: int = 4, **kw):
    from transformers import DataCollatorForSeq2Seq

    from ortlab import ORTSeq2SeqTrainer, ORTSeq2SeqTrainingArguments

    model = make(tokenizer)
    values = {
        "output_dir": str(tmp_path / ("ort" if use_ort else "eager")),
        "max_steps": steps,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "learning_rate": 3e-3,
        "report_to": [],
        "disable_tqdm": True,
        "save_strategy": "no",
        "ort_log_level": "ERROR",
        "seed": 0,
    }
    args = ORTSeq2SeqTrainingArguments(use_ort=use_ort, **{**values, **kw})
    trainer = ORTSeq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=Pairs(),
        eval_dataset=Pairs(8, offset=1000),
        # pads inputs with the pad token and labels with -100, and builds decoder_input_ids from the labels
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
    )
    trainer.train()
    return [s["loss"] for s in trainer.step_metrics.steps], trainer


@pytest.mark.slow
@pytest.mark.parametrize("make", [tiny_t5], ids=["t5"])  # BART: tests/test_dropin_scripts.py (summarization)
def test_encoder_decoder_trains_under_ort_as_in_pytorch(tmp_path, tokenizer, make):
    eager, _ = fit(make, tokenizer, False, tmp_path)
    ort, trainer = fit(make, tokenizer, True, tmp_path)
    record = trainer.accelerations["ort"]
    assert record.applied, record.to_dict()
    diffs = [abs(a - b) for a, b in zip(eager, ort, strict=True)]
    assert max(diffs) < PARITY, (eager, ort)


@pytest.mark.slow
def test_predict_with_generate_runs_pytorch_generate_on_the_trained_weights(tmp_path, tokenizer):
    from transformers import DataCollatorForSeq2Seq

    _, trainer = fit(
        tiny_bart,
        tokenizer,
        True,
        tmp_path,
        predict_with_generate=True,
        generation_max_length=5,
        generation_num_beams=2,
    )
    assert trainer.accelerations["ort"].applied
    assert trainer.accelerations["ort"].details["evaluate_predict"].startswith("PyTorch")
    data = Pairs(4, offset=2000)
    out = trainer.predict(data)
    assert out.predictions.shape[0] == 4
    # the same as generate() on the trained model, with the arguments' max length and beams
    model = trainer.model
    assert type(model).__name__ == "BartForConditionalGeneration"
    batch = DataCollatorForSeq2Seq(tokenizer, model=model)([data[i] for i in range(4)])
    model.eval()
    with torch.no_grad():
        expected = model.generate(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_length=5, num_beams=2
        )
    pad = tokenizer.pad_token_id
    got = torch.as_tensor(out.predictions)
    got = torch.where(got == -100, torch.full_like(got, pad), got)
    assert expected.shape[1] <= 5
    assert torch.equal(got[:, : expected.shape[1]], expected)
    # transformers pads the generated ids to the model's generation_config.max_length: pad only after 5 tokens
    assert bool((got[:, 5:] == pad).all())
    # and eval with generation returns the loss too
    metrics = trainer.evaluate(max_length=4, num_beams=1)
    assert "eval_loss" in metrics


def test_plain_seq2seq_arguments_become_ort_ones(tmp_path, tokenizer):
    from transformers import Seq2SeqTrainingArguments

    from ortlab import ORTSeq2SeqTrainer, ORTSeq2SeqTrainingArguments

    args = Seq2SeqTrainingArguments(
        str(tmp_path), predict_with_generate=True, generation_num_beams=3, learning_rate=5e-4, report_to=[]
    )
    trainer = ORTSeq2SeqTrainer(model=tiny_t5(tokenizer), args=args, feature="seq2seq-lm")
    assert isinstance(trainer.args, ORTSeq2SeqTrainingArguments)
    assert trainer.args.predict_with_generate and trainer.args.generation_num_beams == 3
    assert trainer.args.learning_rate == 5e-4 and trainer.args.use_ort is True
    assert trainer.accelerations["ort"].details["model_changes"]["use_cache"].startswith("False")
    assert trainer.model.decoder.config.use_cache is False, "the decoder's own config copy must not build a cache"
