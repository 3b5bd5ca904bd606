"""The run folder: ortlab's bottom layer, the one format every other part reads and writes.

    rundir.py    the folder itself: its files, the status machine, control requests (stop, pause), checkpoints
    stream.py    the metrics stream (metrics.jsonl): one bounded incremental reader and one fold (RunSummary)
    events.py    the stream's event names, which its writers and readers share
    compare.py   runs side by side, from their summaries

A run folder may come from anyone (copied, unpacked, planted), so everything here reads it through
`ortlab.safeio`: no links followed, every read bounded. Nothing here imports the spec, the trainer or a launcher:
they all stand on this.
"""
