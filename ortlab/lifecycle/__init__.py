"""A run's life in its process: assembly (model, data, trainer) and lifecycle (start, stop, resume, finish).

`assemble` builds what trains from a checked spec: the model and its tokenizer, the tokenized data and its
collator, the `TrainingArguments` and the trainer; it decides nothing. `execute` is the run: it keeps the run
folder's status true, decides what the accelerations left at 'auto' become (`ortlab.tune.auto`, the one reason
this package sits above `ortlab.tune`), evaluates, trains, stops or finishes and saves. Every launcher's run
process calls `execute` (`ortlab.runner`: a launched worker, a Ray job, a Ray Train rank, the foreground); a run
process on this machine is `python -m ortlab.lifecycle RUN_DIR` (`__main__.py`, which the local launcher starts).
"""
