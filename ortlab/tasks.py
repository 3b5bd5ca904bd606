"""Tasks (Optimum called them `feature`s): which model head a run trains, and how to load it.

In ortlab a feature names the task head of the model: `ORTTrainer(..., feature="sequence-classification")`
checks that the model really has that head (a mismatch fails before training, not after an hour), and the
feature is recorded with the run so that export and the model card know what the model does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    name: str
    auto_class: str  # the transformers Auto class that loads this head
    head_suffix: str  # model class names of this head end with it, e.g. BertForSequenceClassification


FEATURES = {
    f.name: f
    for f in (
        Feature("sequence-classification", "AutoModelForSequenceClassification", "ForSequenceClassification"),
        Feature("token-classification", "AutoModelForTokenClassification", "ForTokenClassification"),
        Feature("causal-lm", "AutoModelForCausalLM", "ForCausalLM"),
        Feature("masked-lm", "AutoModelForMaskedLM", "ForMaskedLM"),
        Feature("question-answering", "AutoModelForQuestionAnswering", "ForQuestionAnswering"),
    )
}


def get_feature(name: str) -> Feature:
    try:
        return FEATURES[name]
    except KeyError:
        raise ValueError(f"unknown feature {name!r}: choose one of {', '.join(FEATURES)}") from None


def check_model_matches(model: object, name: str) -> None:
    """Fail early when a transformers model's head is not the one the feature names."""
    feature = get_feature(name)
    cls = type(model).__name__
    is_transformers = any(c.__module__.startswith("transformers.") for c in type(model).__mro__)
    if is_transformers and not cls.endswith(feature.head_suffix):
        raise ValueError(
            f"feature={name!r} needs a model with a *{feature.head_suffix} head, but got {cls}: load the model "
            f"with {feature.auto_class}.from_pretrained(...) or pass the matching feature"
        )
