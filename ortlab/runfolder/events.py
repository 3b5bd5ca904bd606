"""The metrics stream's event names: the `"event"` of each record in `metrics.jsonl`, one constant each.

The writers (`ortlab.train.metricswriter`, the trainer's checks, `ortlab.lifecycle.execute`, Ray Train's restart
record, the chat scorer) and the readers (`stream.RunSummary`, the server, the charts, the terminal, `ortlab follow`,
the Ray log channel) name them from here, so a renamed event cannot leave one reader comparing against the old string.
What each record holds (its fields, their types and units, which views draw them) is written once, in
`ortlab.runfolder.records`. A record from a run folder may carry any event name (anyone can write one): readers pass
over the ones they do not know.
"""

from __future__ import annotations

TRAIN_BEGIN = "train_begin"  # the run's settings, world size, max steps, and the accelerations requested
STEP = "step"  # one optimizer step's numbers
EVAL = "eval"  # one evaluation's scores (`phase` "before" for the score before training)
LOG = "log"  # the Trainer's own log line (smoothed loss, grad_norm, ...)
VERIFIED = "verified"  # what applied, checked after the first step
ACCELERATION = "acceleration"  # one acceleration that was requested and did not apply, and why
PARAMETERS = "parameters"  # how many parameters train, and how many the optimizer holds
GENERATIONS = "generations"  # a chat model's answers to the spec's prompts, scored
AUTO = "auto"  # what the spec's 'auto' accelerations became, and why
RESUME = "resume"  # the run went on from a checkpoint
STOPPED = "stopped"  # the run stopped when asked, at a checkpoint
RESTART = "restart"  # Ray Train restarted the worker group
TRAIN_END = "train_end"  # the run's summary and what applied

# The records that carry the whole accelerations table (requested and applied, by name).
WITH_ACCELERATIONS = (TRAIN_BEGIN, VERIFIED, TRAIN_END)
EVENTS = (
    TRAIN_BEGIN,
    STEP,
    EVAL,
    LOG,
    VERIFIED,
    ACCELERATION,
    PARAMETERS,
    GENERATIONS,
    AUTO,
    RESUME,
    STOPPED,
    RESTART,
    TRAIN_END,
)
