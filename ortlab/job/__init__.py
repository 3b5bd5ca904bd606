"""Job side: what runs inside a job on a cluster node, never on the user's machine (the local head's nodes share it).

    channel.py    the job's end of the channel home: train, print each record tagged for the monitor; the doctor
    mirror.py     a node-local copy of a run whose place is an object store, kept in step with the store
    raytrain.py   a Ray Train run: the job's driver, the workers' training loop, the failure record
    __main__.py   `python -m ortlab.job worker|doctor|raytrain ...`: what a launcher submits

The driver side (launching, following, bringing home) is `ortlab.runner`; the two meet in the run place
(`ortlab.runfolder.place`) and the job's log, whose tags are defined in `channel`. Nothing here imports
`ortlab.runner`.
"""
