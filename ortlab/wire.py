"""What the two ends of a Ray job's channel home agree on: the tags of its log lines and how often the live path
looks for news. The job's end (`ortlab.job.channel`, `ortlab.job.mirror`) writes them, the driver's end
(`ortlab.runner.monitor`, `ortlab.runner.livestream`, the cluster doctor in `ortlab.runner.rayjob`) reads them.

A module of its own, beneath both sides: when the driver borrowed them from `ortlab.job`, `import ortlab.runner`
loaded the job side and with it the whole run process (`ortlab.lifecycle.execute`: the trainer, the tuner, the
data), 90 ortlab modules for four strings. A tagged line is one of ortlab's records only if it parses as the shape
its tag promises (the monitor checks; the job's log is shared with every library and the user's code).
"""

from __future__ import annotations

METRIC_TAG = "@@ortlab-metric "  # {"seq": n, "record": {...}}: a record of the run's metrics.jsonl, n its index there
FINAL_TAG = "@@ortlab-final "  # the run's final status.json
DOCTOR_TAG = "@@ortlab-doctor "  # the cluster doctor job's report
PAUSED_TAG = "@@ortlab-paused "  # true or false: whether the run holds at a pause gate
TAGS = (METRIC_TAG, FINAL_TAG, PAUSED_TAG)  # the tags of a training job's log (the doctor's is its own job's)

# A Ray Train run's live path, whose stream the local monitor reads from the store: rank 0 pushes a grown stream
# at most this often, the monitor looks for one this often (one HEAD when nothing was added).
LIVE_S = 0.25
