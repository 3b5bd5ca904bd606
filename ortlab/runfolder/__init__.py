"""The run folder: ortlab's bottom layer, the one format every other part reads and writes.

    rundir.py    the folder itself: its files, the status machine, control requests (stop, pause), checkpoints
    stream.py    the metrics stream (metrics.jsonl): one bounded incremental reader and one fold (RunSummary)
    lines.py     one metrics line to one record: the careful parse and its fast path for the common line
    history.py   a run's history in one pass: the curves as float arrays, and its summary
    downsample.py  fewer points that keep a curve's shape (min/max per bucket), for every chart
    events.py    the stream's event names, which its writers and readers share
    compare.py   runs side by side, from their summaries

A run folder may come from anyone (copied, unpacked, planted), so everything here reads it through
`ortlab.safeio`: no links followed, every read bounded. Nothing here imports the spec, the trainer or a launcher:
they all stand on this.
"""
