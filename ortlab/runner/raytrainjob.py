"""Driver side: the Ray Train launcher: one run across several workers of a Ray cluster (`processes > 1`).

A Ray Train run is a Ray job like any other cluster run (`RayJob`: the cluster's doctor, a run folder in the
storage, a local monitor that mirrors it home), but the job's entrypoint is a Ray Train driver
(`python -m ortlab.job raytrain RUN_PLACE`, in `ortlab.job.raytrain`) instead of one training process. The driver starts
`target.processes` workers through Ray Train's `TorchTrainer` (the process group over gloo on CPUs, NCCL on GPUs;
DeepSpeed's ZeRO-1 joins it), each training the spec with `ortlab.lifecycle.execute` as a torchrun rank would;
rank 0 writes the run folder. When a worker dies, Ray Train restarts the whole group, up to `target.max_failures`
times; each new group resumes from the run's last complete checkpoint and says so in the metrics stream.

    preflight  the cluster's doctor: reachable, authenticated, ortlab installed, the mix available there, and
               enough CPUs and GPUs in all and on some node for one worker (a worker runs on one node)
    start      as RayJob; the driver reserves nothing (it waits), the workers reserve `cpus_per_process` and
               `gpus_per_process` each
    terminate  as RayJob: the job is stopped, and with its driver the workers
"""

from __future__ import annotations

from typing import Any

from ortlab.runner.rayjob import JOB, RayJob


class RayTrain(RayJob):
    kind = "ray-train"

    def shape_problems(self, spec: Any) -> list[str]:
        return []  # several processes by construction (launcher_for): ZeRO has ranks to shard across

    def entrypoint(self, spec: Any, remote: str) -> str:
        # The driver reads the workers, their resources and max_failures from the storage folder's spec.yaml.
        return f"-m {JOB} raytrain {remote}"

    def job_resources(self, spec: Any) -> dict[str, Any]:
        # The driver only waits for Ray Train; reserving a worker's CPU for it would leave a worker unplaced.
        return {"entrypoint_num_cpus": 0}
