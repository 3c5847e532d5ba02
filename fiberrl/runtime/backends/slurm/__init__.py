"""Slurm backend: each job-backed process is one Slurm batch job.

``create_job`` pipes a generated batch script into ``sbatch --parsable``
(no script file is left anywhere).  The script exports the job's
environment: fiberrl's variables, the Python ones, ``forward_env``, PATH and
HOME; sbatch itself runs with a scrubbed environment and ``--export=ALL``,
so nothing else of this shell travels (``--export=NONE`` would also work
but makes each node load the user's login environment, 1-3 s a job).  The
script runs the command in the foreground, and writes its exit code to
``<slurm_dir>/<jobid>.exit``, newline-terminated so that a reader can tell
it is complete.  Output goes to ``<slurm_dir>/<jobid>.log``.  ``slurm_dir``
must be on a file system every node shares: the run's secret travels in a
file there (mode 0600), never in the script or the job's environment,
which Slurm keeps and shows (``scontrol write batch_script``, ``sacct``).

One thread per backend keeps the state of every job it started: one
``squeue`` for all of them per second, and a look at the exit files of
running jobs four times a second, so ``status()`` is a lookup.  A job that
stays pending past ``schedule_timeout``, or whose pending reason can never
change (no node of the partition has what it asks), is cancelled and
reported as never run.

Every job of a run is named ``fiberrl-<run>`` (``scancel --name`` sweeps a
run) and carries ``--comment=fiberrl-owner=<owner>`` (``cleanup(owner)``
finds a process's jobs by it).

The modules: ``backend`` (SlurmBackend), ``sbatch`` (options and
submission), ``script`` (the batch script, exit and secret files),
``tracker`` (the monitor), ``outcomes`` (exit codes of jobs that left no
exit file, pending jobs that will never start), ``state`` (what the monitor
knows of a job), ``jobinfo`` (squeue and sacct records), ``commands``
(running Slurm's commands), ``network`` (the listen host) and ``submit``
(``fiberrl submit``'s runs).
"""
from .backend import SlurmBackend
from .commands import SlurmError, slurm_available
from .script import batch_script

__all__ = ["SlurmBackend", "SlurmError", "batch_script", "slurm_available"]
