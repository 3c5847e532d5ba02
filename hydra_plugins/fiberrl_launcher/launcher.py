"""``hydra/launcher=fiberrl``: each run of a sweep is a job-backed ``fiberrl.runtime.Process`` on the
configured backend, so its own workers are jobs of the same backend.

Runs go at the same time (``runs_at_once``). A run that raises is that run's FAILED result; a run
whose job dies (SIGKILL, OOM, a lost node) is started again up to ``retries`` times, from its own
checkpoint when the app has one (``resume_key``), and the sweep goes on either way; one whose job
was told to stop (SIGTERM: a preempted node, a deleted pod; it checkpoints and exits with 143) is
started again from its checkpoint without counting as a try, as is one whose job goes unheard past
``silence_timeout`` (its host cut off or stalled: given up, so that it cannot come back beside its
successor). Run again on
the same ``hydra.sweep.dir``, a sweep keeps its job numbers and folders, takes the finished runs'
results as they were and resumes the others. Every run's config is composed and checked before any
run starts.
"""

import hashlib
import logging
import marshal
import os
import pickle
import signal
import sys
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from fiberrl.runtime.processes.stop_signal import told_to_stop
from fiberrl.sweepable import hooks_of

from .progress import SweepTable
from .run_in_job import OUTPUT_LOG, RETURN_FILE, run_sweep_job

log = logging.getLogger(__name__)
# in the sweep's folder: the command line's overrides of the sweep it holds
SWEEP_RECORD = ".sweep.yaml"


class SweepError(Exception):
    """Bad input to a sweep, found before any run started: the message says what and what to do."""


class RunLost(RuntimeError):
    """A run whose job died each time it was started."""


@dataclass
class Run:
    num: int
    overrides: list[str]
    label: str                      # the overrides in which it differs from the batch's other runs
    config: DictConfig
    folder: Path
    fingerprint: str                # what its result follows from (FiberrlLauncher._fingerprint)
    state: str = "queued"           # queued, running, retrying, done, failed
    attempts: int = 0               # times its job was started
    preempted: int = 0              # of which it was told to stop (SIGTERM): not counted as tries
    cut_off: int = 0                # of which its host was cut off or stalled: not counted either
    unheard: bool = False           # whether its latest start was given up for going unheard
    process: Any = None
    result: Optional[JobReturn] = None
    why: str = ""                   # a failed run's reason, in one line
    resumed: bool = False           # whether its latest start went on from its checkpoint

    @property
    def tries(self) -> int:
        """Starts that count against the retries: those not ended by its host (told to stop, cut off)."""
        return self.attempts - self.preempted - self.cut_off


class FiberrlLauncher(Launcher):
    def __init__(self, runs_at_once: Optional[int] = None, backend: Optional[str] = None,
                 backend_settings: Any = None, cpu: Optional[float] = 1, gpu: Optional[int] = None,
                 mem: Optional[int] = None, retries: int = 2, resume_key: Optional[str] = None,
                 resume_needs: Optional[str] = None, check: Optional[str] = None, configure: Optional[str] = None,
                 table: str = "auto", preload: bool = True) -> None:
        self.runs_at_once = runs_at_once
        self.backend = backend
        self.backend_settings = backend_settings
        self.resources = {k: v for k, v in (("cpu", cpu), ("gpu", gpu), ("mem", mem)) if v is not None}
        self.retries = retries
        self.resume_key = resume_key
        self.resume_needs = resume_needs
        self.next_steps = None  # the app's, from its sweepable hooks
        self.preload = preload
        self.run_modules = None  # the app's: (a run's config) -> the modules its job imports as it starts
        self._job_modules: list[str] = []  # what every run's job imports: the launcher's and the task's modules
        self.check = check
        self.configure = configure
        self.table_mode = table
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None
        self.runs: list[Run] = []  # every batch's, for sweep.csv
        self.at_once = 1

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function
        # what the app says of itself, where the settings say nothing
        hooks = hooks_of(task_function)
        self.check = self.check or hooks.get("check")
        self.configure = self.configure or hooks.get("configure")
        self.resume_key = self.resume_key or hooks.get("resume_key")
        self.resume_needs = self.resume_needs or hooks.get("resume_needs") or "*"
        self.next_steps = hooks.get("next_steps")
        self.run_modules = hooks.get("preload") if self.preload else None

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        labels = _labels(job_overrides)
        try:
            self.open(len(job_overrides))
            batch = [self.plan(initial_job_idx + i, list(overrides), labels[i])
                     for i, overrides in enumerate(job_overrides)]
        except SweepError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        log.info(f"Launching {len(batch)} jobs, {self.at_once} at a time, on the {self._backend_name()} backend")
        for run in batch:
            log.info(f"\t#{run.num} : {' '.join(filter_overrides(run.overrides))}"
                     + (" (done earlier)" if run.state == "done" else ""))
        try:
            for run in batch:
                self.submit(run)
            while self.busy():
                self.poll()
        finally:
            self.close()
        self._report_failures(batch)
        print(f"sweep: {sweep_dir} ({len(self.runs)} runs; each run's folder and its result in "
              f"{sweep_dir / 'sweep.csv'})", flush=True)
        for line in self.next_steps(sweep_dir) if self.next_steps is not None else ():
            print(line, flush=True)
        return [run.result for run in batch]

    # --- for a sweeper that starts runs as others end (hydra/sweeper=pbt) ------------------------
    # open(); plan() and submit() runs, poll() for those that ended, while busy(); close() (it stops
    # every run still going: Ctrl-C, an error)
    def open(self, runs: int) -> None:
        """Check the settings and set up the runtime; ``runs``: how many may go at once at most (the
        batch, the population). Raises SweepError. Nothing is written before the first ``submit``."""
        setup_globals()
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        self._sweep_dir = Path(str(self.config.hydra.sweep.dir))
        self._check_settings()
        self._check_sweep_dir(self._sweep_dir)
        self._configure_runtime()
        self.at_once = self._runs_at_once(runs)
        self._recorded = False
        # a run's math libraries (torch, numpy) use as many threads as it has cores (cpu), unless the user set
        # them: runs side by side would each start a thread per core of the machine, and those spin waiting
        # on one another (joblib's loky caps its workers' threads alike); the jobs inherit them
        threads = str(max(1, int(self.resources.get("cpu") or 1)))
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, threads)
        # local run jobs are forked with the app and Hydra's job machinery already imported
        self._job_modules = sorted({__name__.rsplit(".", 1)[0] + ".run_in_job", "hydra.core.utils",
                                    getattr(self.task_function, "__module__", None) or "hydra"} - {"__main__"})
        # what each run's job restores of Hydra's singletons (its config store, search path...): one copy
        self._hydra_state = Singleton.get_state()
        self._waiting, self._running = deque(), []
        self._table = SweepTable(self.runs, self._sweep_dir, self.table_mode)

    def submit(self, run: Run) -> None:
        """Start ``run`` when fewer than ``at_once`` are going; one done earlier is only recorded."""
        if not self._recorded:  # the sweep's folder says which sweep it holds once a run is in it
            self._sweep_dir.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(OmegaConf.create({"task": list(self._sweep_overrides())}), self._sweep_dir / SWEEP_RECORD)
            self._recorded = True
        if run not in self.runs:
            self.runs.append(run)
        if run.state != "done":
            self._waiting.append(run)
        self._table.changed(run)

    def busy(self) -> bool:
        return bool(self._waiting or self._running)

    def poll(self, timeout: float = 0.5) -> list[Run]:
        """Start what may start, wait up to ``timeout`` s, and return the runs that ended since (done or
        failed; a run whose job died and has tries left is started again instead)."""
        try:
            while self._waiting and len(self._running) < self.at_once:
                run = self._waiting.popleft()
                self._start(run)
                self._running.append(run)
                self._table.changed(run)
            ended = []
            if self._running:
                wait([run.process.sentinel for run in self._running], timeout=timeout)
            for run in self._running:
                if not run.unheard and run.process.exitcode is None and run.process.unheard():
                    self._give_up(run)
            for run in [run for run in self._running if run.process.exitcode is not None]:
                self._running.remove(run)
                self._ended(run)
                if run.state == "retrying":
                    self._waiting.appendleft(run)
                else:
                    ended.append(run)
                self._table.changed(run)
            self._table.refresh()
            return ended
        except BaseException:
            self._stop(self._running)
            raise

    def close(self) -> None:
        """Stop every run still going, and write the table."""
        try:
            self._stop(self._running)
        finally:
            self._table.close()
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)

    # --- before anything starts -----------------------------------------------------------------
    def _check_settings(self) -> None:
        if self.runs_at_once is not None and self.runs_at_once < 1:
            raise SweepError(f"hydra.launcher.runs_at_once={self.runs_at_once}: must be at least 1")
        if self.retries < 0:
            raise SweepError(f"hydra.launcher.retries={self.retries}: must be 0 or more")
        if self.table_mode not in ("auto", "plain", "off"):
            raise SweepError(f"hydra.launcher.table={self.table_mode}: must be auto, plain or off")
        for key, value in self.resources.items():
            if isinstance(value, bool) or value < 0 or (key == "cpu" and value == 0):
                raise SweepError(f"hydra.launcher.{key}={value}: must be a positive number")

    def _sweep_overrides(self) -> list:
        return list(self.config.hydra.overrides.task)

    def _check_sweep_dir(self, sweep_dir: Path) -> None:
        record = sweep_dir / SWEEP_RECORD
        if not record.is_file():
            return
        before = list(OmegaConf.load(record).task)
        if before != self._sweep_overrides():
            raise SweepError(f"{sweep_dir} holds another sweep ({' '.join(before) or 'no overrides'}); choose "
                             f"another hydra.sweep.dir, or run that sweep's own command to resume it")

    def plan(self, num: int, overrides: list[str], label: str, subdir: Optional[str] = None) -> Run:
        """Job ``num``'s config, composed and checked; its folder (``subdir`` of the sweep's, or
        ``hydra.sweep.subdir``), checked to be this run's; what it already did there (a finished run keeps
        its result, an unfinished one resumes). Raises SweepError."""
        config = self._compose(num, overrides)
        if subdir is not None:
            with read_write(config.hydra), open_dict(config):
                config.hydra.sweep.subdir = subdir
        folder = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
        run = Run(num, overrides, label, config, folder, self._fingerprint(config))
        if self.check:
            self._check_run(run)
        ran = folder / ".hydra" / "overrides.yaml"
        if ran.is_file():
            before = [o for o in OmegaConf.to_container(OmegaConf.load(ran))
                      if not (self.resume_key and o.startswith(f"{self.resume_key}="))]
            if before != overrides:
                raise SweepError(f"{folder} holds another sweep's run ({' '.join(before) or 'no overrides'}), "
                                 f"not job #{num} ({' '.join(overrides) or 'no overrides'}); choose another "
                                 f"hydra.sweep.dir, or run that sweep's own command to resume it")
        earlier = _read_return(folder / RETURN_FILE, run.fingerprint)
        if earlier is not None and earlier.status == JobStatus.COMPLETED:
            earlier.hydra_cfg = earlier.hydra_cfg or config
            run.state, run.result = "done", earlier
        return run

    def check_overrides(self, overrides: list[str]) -> None:
        """Compose a run of ``overrides`` and check it as every run is checked; raises SweepError."""
        try:
            config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        except Exception as exc:
            raise SweepError((str(exc).splitlines() or [type(exc).__name__])[0]) from None
        if self.check:
            check = _hook("check", self.check)
            try:
                check(_without_hydra(config))
            except Exception as exc:
                raise SweepError(str(exc)) from None

    def _fingerprint(self, config: DictConfig) -> str:
        """What a run's result follows from: the task's code and the run's settings. A sweep run again
        takes an earlier result only where both are unchanged."""
        code = getattr(self.task_function, "__code__", None)
        task = marshal.dumps(code) if code is not None else repr(self.task_function).encode()
        settings = OmegaConf.to_yaml(_without_hydra(config), resolve=True).encode()
        return hashlib.sha256(task + b"\0" + settings).hexdigest()

    def _compose(self, num: int, overrides: list[str], extra: Sequence[str] = ()) -> DictConfig:
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides + list(extra))
        with open_dict(config):
            config.hydra.job.id = num
            config.hydra.job.num = num
        # the folder is fixed once: a resume's extra override must not move it, nor a ${now:} its time
        HydraConfig.instance().set_config(config)
        with read_write(config.hydra), open_dict(config):
            config.hydra.sweep.dir = str(config.hydra.sweep.dir)
            config.hydra.sweep.subdir = str(config.hydra.sweep.subdir)
        return config

    def _check_run(self, run: Run) -> None:
        check = _hook("check", self.check)
        try:
            check(_without_hydra(run.config))
        except Exception as exc:
            raise SweepError(f"job #{run.num} ({run.label}): {exc}") from None

    def _configure_runtime(self) -> None:
        import fiberrl.runtime as mp
        from fiberrl.runtime.config import ConfigError
        if self.configure:
            try:
                _hook("configure", self.configure)(_without_hydra(self.config))
            except Exception as exc:
                raise SweepError(f"hydra.launcher.configure={self.configure}: {exc}") from None
        settings = dict(self.backend_settings or {})
        if self.backend not in (None, "auto"):
            settings["backend"] = self.backend
        if settings:
            try:
                mp.configure(**settings)
            except ConfigError as exc:
                raise SweepError(f"hydra.launcher.backend_settings: {exc}") from None
        backend = self._backend_name()
        if backend == "local":
            self._check_local_resources()

    def _backend_name(self) -> str:
        from fiberrl.runtime.backends import resolve_name
        from fiberrl.runtime.config import get_config
        return resolve_name(get_config().backend)

    def _check_local_resources(self) -> None:
        cores = os.cpu_count() or 1
        if self.resources.get("cpu", 0) > cores:
            raise SweepError(f"hydra.launcher.cpu={self.resources['cpu']:g}: this machine has {cores} cores; "
                             f"ask for at most {cores}, or sweep on a cluster backend")
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
        if self.resources.get("mem", 0) > memory:
            raise SweepError(f"hydra.launcher.mem={self.resources['mem']}: this machine has {memory} MiB; "
                             f"ask for less, or sweep on a cluster backend")
        if self.resources.get("gpu"):
            from fiberrl.runtime.backends.local import visible_gpus
            gpus = len(visible_gpus())
            if self.resources["gpu"] > gpus:
                raise SweepError(f"hydra.launcher.gpu={self.resources['gpu']}: this machine shows {gpus} GPUs "
                                 f"(CUDA_VISIBLE_DEVICES or nvidia-smi); ask for at most {gpus}")

    def _runs_at_once(self, runs: int) -> int:
        if self.runs_at_once is not None:
            return self.runs_at_once
        if self._backend_name() != "local":
            return max(1, runs)  # the cluster's manager queues what it cannot place yet
        fit = [(os.cpu_count() or 1) // max(1.0, self.resources.get("cpu") or 1.0)]
        if self.resources.get("mem"):
            free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") >> 20
            fit.append(free // self.resources["mem"])
        if self.resources.get("gpu"):
            from fiberrl.runtime.backends.local import visible_gpus
            fit.append(len(visible_gpus()) // self.resources["gpu"])
        return max(1, int(min(fit)))

    # --- running --------------------------------------------------------------------------------
    def _start(self, run: Run) -> None:
        import fiberrl.runtime as mp
        config = run.config
        run.resumed = bool(self.resume_key and run.folder.is_dir() and any(run.folder.glob(self.resume_needs)))
        if run.resumed:
            # quoted: a folder named by its overrides holds '=' and ','
            quoted = str(run.folder).replace("\\", "\\\\").replace("'", "\\'")
            config = self._compose(run.num, run.overrides, [f"{self.resume_key}='{quoted}'"])
            with read_write(config.hydra), open_dict(config):
                config.hydra.sweep.subdir = run.config.hydra.sweep.subdir
        (run.folder / RETURN_FILE).unlink(missing_ok=True)
        # and with what this run imports as it starts (a sweep's runs may differ: algo=es,ppo)
        mp.set_forkserver_preload(self._job_modules + list(self.run_modules(config) if self.run_modules else ()))
        process = mp.Process(target=run_sweep_job, name=f"sweep-run-{run.num}",
                             args=(self.hydra_context, self.task_function, config, run.overrides, str(run.folder),
                                   self._hydra_state, run.fingerprint))
        process._resources = {**self.resources, **self._to_start_jobs()}
        process.start()
        run.process, run.state = process, "running"
        run.attempts += 1

    def _to_start_jobs(self) -> dict:
        """What a run's job needs to start its own workers as jobs: on Docker, the daemon's socket
        (as ``fiberrl submit`` gives a master; the run's workers do not get it)."""
        if self._backend_name() != "docker":
            return {}
        from fiberrl.runtime.backends.docker import DOCKER_SOCKET, docker_host
        host = docker_host()
        return {"volumes": {host[len("unix://"):]: DOCKER_SOCKET}} if host.startswith("unix://") else {}

    def _give_up(self, run: Run) -> None:
        """A run's job unheard past ``silence_timeout``: its host is cut off or stalled. It is killed
        and its link ended (``Process.cut_off``), so that it ends itself if its host comes back."""
        run.unheard = True
        log.warning(f"#{run.num}: its job has not been heard for over silence_timeout: its host is cut off or "
                    f"stalled; giving it up")
        try:
            run.process.cut_off()
        except Exception as exc:  # the backend cannot reach it either: its lifeline ends it
            log.warning(f"#{run.num}: could not kill its job: {exc}")

    def _ended(self, run: Run) -> None:
        result = _read_return(run.folder / RETURN_FILE, run.fingerprint)
        code = run.process.exitcode
        run.process.close()
        if result is not None:
            result.hydra_cfg = result.hydra_cfg or run.config
            run.result = result
            run.state = "done" if result.status == JobStatus.COMPLETED else "failed"
            if run.state == "done" and run.why:
                run.why = f"an earlier try: {run.why}"
            if run.state == "failed":
                error = result._return_value
                run.why = f"{type(error).__name__}: {error}".splitlines()[0]
            return
        if run.unheard:
            run.unheard = False
            run.cut_off += 1
            self._again_uncounted(run, f"its job went unheard (its host cut off or stalled), {run.cut_off} time(s)")
            return
        if told_to_stop(code):
            # its host taken back (a preempted node, a deleted pod)
            run.preempted += 1
            self._again_uncounted(run, f"its job was told to stop ({_exit_text(code)}), {run.preempted} time(s)")
            return
        run.why = f"its job died ({_exit_text(code)}); its output: {run.folder / OUTPUT_LOG}"
        if run.tries <= self.retries:
            log.warning(f"#{run.num}: {run.why}; starting it again"
                        + (" from its checkpoint" if self.resume_key else ""))
            run.state = "retrying"
            return
        run.state = "failed"
        run.why = f"{run.why} ({run.tries} tries)"
        run.result = JobReturn(overrides=run.overrides, cfg=run.config, hydra_cfg=run.config,
                               working_dir=str(run.folder), status=JobStatus.FAILED,
                               _return_value=RunLost(f"job #{run.num}: {run.why}"))

    def _again_uncounted(self, run: Run, why: str) -> None:
        """Its host ended it, no fault of the run's: it starts again, not counted as a try."""
        run.why = why
        log.warning(f"#{run.num}: {why}; starting it again" + (" from its checkpoint" if self.resume_key else "")
                    + " (not counted as a try)")
        run.state = "retrying"

    def _stop(self, runs: list[Run]) -> None:
        """Ctrl-C or an error here: every run's job ends (the runtime ends each job's own)."""
        for run in runs:
            if run.process is not None and run.state == "running":
                run.process.kill()
        for run in runs:
            if run.process is not None and run.state == "running":
                run.process.join(10)

    def _report_failures(self, batch: list[Run]) -> None:
        failed = [run for run in batch if run.state == "failed"]
        if failed:
            print(f"{len(failed)} of {len(batch)} runs failed:", file=sys.stderr)
            for run in failed:
                print(f"  #{run.num} {run.label}: {run.why} (log: {run.folder})", file=sys.stderr)


def _labels(job_overrides: Sequence[Sequence[str]]) -> list[str]:
    shared = set.intersection(*map(set, job_overrides)) if len(job_overrides) > 1 else set()
    return [" ".join(o for o in filter_overrides(overrides) if o not in shared) or "(no overrides)"
            for overrides in job_overrides]


def _hook(setting: str, spec):
    """A callable the app gave, or one a setting names as module:function."""
    import importlib
    if callable(spec):
        return spec
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise SweepError(f"hydra.launcher.{setting}={spec}: {exc}; give it as module:function") from None


def _without_hydra(config: DictConfig) -> DictConfig:
    return OmegaConf.masked_copy(config, [key for key in config if key != "hydra"])


def _read_return(path: Path, fingerprint: str) -> Optional[JobReturn]:
    """The JobReturn a run left, if it was computed by what ``fingerprint`` stands for."""
    try:
        with open(path, "rb") as fh:
            record = pickle.load(fh)
    except FileNotFoundError:
        return None
    except Exception as exc:  # a damaged record is a run to do again, said once
        log.warning(f"{path}: unreadable ({exc}); the run is done again")
        return None
    return record["return"] if record.get("fingerprint") == fingerprint else None


def _exit_text(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"
