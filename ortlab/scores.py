"""Evaluation metrics per task, computed with numpy only (no extra packages, easy to check by hand).

- sequence classification: accuracy and macro F1 (every class counts the same, so a majority-class model
  does not look good on imbalanced data);
- token classification: entity-level precision, recall and F1 over BIO spans (an entity counts only if its
  type and its exact span are right, as in seqeval/CoNLL), plus token accuracy;
- causal LM: perplexity, exp(mean token cross-entropy) = exp(eval_loss);
- seq2seq: with generation, exact match and token F1 of the generated text against the target (both decoded by
  the run's tokenizer, so casing and spacing are compared as the tokenizer gives them back); without, the
  teacher-forced token accuracy. The eval loss always. Scores such as ROUGE, BLEU or chrF would need extra packages
  and a language-aware tokenization; these two are cheap, exact and say whether the model learnt the mapping.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any


def argmax_logits(logits: Any, labels: Any) -> Any:
    """Keep only the predicted ids during evaluation (logits of a whole eval set can be large)."""
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def classification(predictions: Any, labels: Any, num_labels: int) -> dict[str, float]:
    import numpy as np

    predictions, labels = np.asarray(predictions), np.asarray(labels)
    accuracy = float((predictions == labels).mean()) if labels.size else 0.0
    f1s = []
    for c in range(num_labels):
        tp = float(((predictions == c) & (labels == c)).sum())
        fp = float(((predictions == c) & (labels != c)).sum())
        fn = float(((predictions != c) & (labels == c)).sum())
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return {"accuracy": accuracy, "f1": float(sum(f1s) / len(f1s)) if f1s else 0.0}


def spans(tags: list[str]) -> set[tuple[str, int, int]]:
    """(type, start, end) of each BIO entity. An I- tag without a matching B- starts an entity (as seqeval)."""
    found, kind, start = set(), None, 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, label = tag.partition("-")
        continues = prefix == "I" and label == kind
        if kind is not None and not continues:
            found.add((kind, start, i))
            kind = None
        if prefix in ("B", "I") and not continues:
            kind, start = label, i
    return found


def entities(pred_rows: list[list[str]], gold_rows: list[list[str]]) -> dict[str, float]:
    tp = n_pred = n_gold = 0
    correct_tokens = total_tokens = 0
    for pred, gold in zip(pred_rows, gold_rows, strict=True):
        p, g = spans(pred), spans(gold)
        tp += len(p & g)
        n_pred += len(p)
        n_gold += len(g)
        correct_tokens += sum(a == b for a, b in zip(pred, gold, strict=True))
        total_tokens += len(gold)
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "token_accuracy": correct_tokens / total_tokens if total_tokens else 0.0,
    }


def token_f1(prediction: str, reference: str) -> float:
    """F1 of the whitespace tokens two texts share (as a bag: a word counts as often as both have it)."""
    pred, ref = prediction.split(), reference.split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def text_match(predictions: list[str], references: list[str]) -> dict[str, float]:
    """Exact match (after collapsing whitespace) and mean token F1 over pairs of texts."""
    pairs = [(" ".join(p.split()), " ".join(r.split())) for p, r in zip(predictions, references, strict=True)]
    if not pairs:
        return {"exact_match": 0.0, "token_f1": 0.0}
    return {
        "exact_match": sum(p == r for p, r in pairs) / len(pairs),
        "token_f1": sum(token_f1(p, r) for p, r in pairs) / len(pairs),
    }


def seq2seq_metrics(tokenizer: Any, generated: bool) -> Callable[[Any], dict[str, float]]:
    """`compute_metrics` for seq2seq: predictions are generated ids (`generated`) or argmaxed logits."""
    import numpy as np

    def compute(p: Any) -> dict[str, float]:
        preds, labels = np.asarray(p.predictions), np.asarray(p.label_ids)
        if not generated:  # teacher forcing: position i predicts label i
            keep = labels != -100
            return {"token_accuracy": float((preds[keep] == labels[keep]).mean()) if keep.any() else 0.0}
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # -100 marks padding in labels, and in generated ids padded across batches; neither is text
        preds = np.where((preds < 0) | (preds >= len(tokenizer)), pad, preds)
        labels = np.where(labels < 0, pad, labels)
        decode = tokenizer.batch_decode
        return text_match(decode(preds, skip_special_tokens=True), decode(labels, skip_special_tokens=True))

    return compute


def compute_metrics_for(
    task: str, label_names: list[str], tokenizer: Any = None, generated: bool = False
) -> Callable[[Any], dict[str, float]] | None:
    """The Trainer `compute_metrics` for a task: its record's `metrics` (None for causal LM: perplexity comes from
    the eval loss; for preference: its trainer scores the pairs itself)."""
    from ortlab.tasks import get_task

    record = get_task(task)
    return record.part("metrics")(label_names, tokenizer, generated) if record.metrics else None


# --- each task's compute_metrics factory (its record's `metrics`): `(label_names, tokenizer, generated)` -----------


def sequence_metrics(label_names: list[str], tokenizer: Any = None, generated: bool = False) -> Callable:
    return lambda p: classification(p.predictions, p.label_ids, len(label_names))


def token_metrics(label_names: list[str], tokenizer: Any = None, generated: bool = False) -> Callable:
    def token(p: Any) -> dict[str, float]:
        preds, golds = [], []
        for pred_row, gold_row in zip(p.predictions, p.label_ids, strict=True):
            keep = [(int(a), int(b)) for a, b in zip(pred_row, gold_row, strict=True) if b != -100]
            preds.append([label_names[a] if 0 <= a < len(label_names) else "O" for a, _ in keep])
            golds.append([label_names[b] for _, b in keep])
        return entities(preds, golds)

    return token


def seq2seq_task_metrics(label_names: list[str], tokenizer: Any = None, generated: bool = False) -> Callable:
    return seq2seq_metrics(tokenizer, generated)


def eval_scores(metrics: dict[str, Any]) -> dict[str, float]:
    """The quality numbers of an evaluation, named without their `eval_` prefix, and without the timing entries
    that transformers adds to them (runtime, samples per second, model preparation time)."""
    return {
        k[5:]: v
        for k, v in metrics.items()
        if k.startswith("eval_") and isinstance(v, float) and not k.endswith(("runtime", "per_second", "_time"))
    }


def format_scores(metrics: dict[str, Any]) -> str:
    """`loss 0.4884, accuracy 0.7860, f1 0.7752`: an evaluation on one line."""
    return ", ".join(f"{k} {v:.4f}" for k, v in eval_scores(metrics).items())


def add_perplexity(metrics: dict[str, float], prefix: str = "eval") -> dict[str, float]:
    loss = metrics.get(f"{prefix}_loss")
    if loss is not None:
        metrics[f"{prefix}_perplexity"] = math.exp(loss) if loss < 50 else float("inf")
    return metrics
