"""Hydra's own documentation examples, swept with ``hydra/launcher=fiberrl`` and with Hydra's basic launcher.

    python experiments/compat/hydra_examples_sweep.py <hydra checkout>

Each example app of Hydra's tutorials and patterns runs unchanged (a copy of its folder) as a
sweep under both launchers; what every run printed must be the same (the basic launcher's runs print
on the sweep's stdout, fiberrl's runs into their folders' output.log), and every run folder must hold
Hydra's records (.hydra/config.yaml, overrides.yaml, hydra.yaml). An example that fails with the basic
launcher too (one written for a newer Hydra than the one installed) is skipped, with its error. Prints
one line per example and a last line ``hydra_examples_sweep: <passed>/<tried> examples give the same runs``.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# example (under examples/) and the sweep its documentation page runs, or one that fits it
EXAMPLES = {
    "tutorials/basic/your_first_hydra_app/1_simple_cli/my_app.py": ["+db.driver=mysql,postgresql", "+db.user=omry"],
    "tutorials/basic/your_first_hydra_app/2_config_file/my_app.py": ["db.user=root,omry"],
    "tutorials/basic/your_first_hydra_app/3_using_config/my_app.py": ["db.port=3306,3307"],
    "tutorials/basic/your_first_hydra_app/4_config_groups/my_app.py": ["+db=mysql,postgresql"],
    "tutorials/basic/your_first_hydra_app/5_defaults/my_app.py": ["db=mysql,postgresql"],
    "tutorials/basic/your_first_hydra_app/6_composition/my_app.py": ["schema=warehouse,support", "db=mysql,postgresql"],
    "tutorials/basic/running_your_hydra_app/4_logging/my_app.py": ["+x=1,2"],
    "tutorials/basic/running_your_hydra_app/5_basic_sweep/my_app.py": ["db=glob(*)"],
    "tutorials/structured_configs/1_minimal/my_app.py": ["port=80,8080"],
    "tutorials/structured_configs/3_config_groups/my_app.py": ["+db=mysql,postgresql"],
    "tutorials/structured_configs/4_defaults/my_app.py": ["db=mysql,postgresql"],
    "tutorials/structured_configs/5.1_structured_config_schema_same_config_group/my_app.py": ["db=mysql,postgresql"],
    "patterns/configuring_experiments/my_app.py": ["+experiment=aplite,nglite"],
    "patterns/extending_configs/my_app.py": ["db=base_mysql,mysql_extending_from_this_group"],
    "configure_hydra/job_override_dirname/my_app.py": ["learning_rate=0.1,0.01", "seed=1,2"],
}
HYDRA_LOG = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\]\[[^]]+\]")
# Python's warnings about Hydra itself, printed on stderr by either launcher's runs
WARNING = re.compile(r"Warning: |^See https://hydra.cc/docs/")


def main() -> None:
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / "examples").is_dir():
        sys.exit("usage: python experiments/compat/hydra_examples_sweep.py <a checkout of facebookresearch/hydra>")
    examples = Path(sys.argv[1]) / "examples"
    passed = tried = 0
    for example, sweep in EXAMPLES.items():
        source = examples / example
        if not source.is_file():
            print(f"  {example}: not in this checkout")
            continue
        with tempfile.TemporaryDirectory(prefix="hydra-example-") as scratch:
            app = Path(scratch) / "app"
            shutil.copytree(source.parent, app)
            basic = run(app / source.name, sweep, "basic", Path(scratch) / "basic")
            fiberrl = run(app / source.name, sweep, "fiberrl", Path(scratch) / "fiberrl")
        if basic[0] != 0:
            last = basic[1].strip().splitlines()[-1] if basic[1].strip() else ""
            print(f"  skipped  {example}: it fails with Hydra's basic launcher too, on this Hydra ({last[:100]})")
            continue
        same = fiberrl[0] == 0 and basic[1] == fiberrl[1] and basic[2] == fiberrl[2]
        passed, tried = passed + same, tried + 1
        print(f"  {'same' if same else 'DIFFERENT'}  {example} -m {' '.join(sweep)}: {len(fiberrl[2])} runs"
              + ("" if same else f"\n    basic: {basic}\n    fiberrl: {fiberrl}"), flush=True)
    print(f"hydra_examples_sweep: {passed}/{tried} examples give the same runs")


def run(app: Path, sweep: list[str], launcher: str, sweep_dir: Path):
    """Exit status, what the runs printed (sorted lines), and each run's overrides."""
    done = subprocess.run([sys.executable, str(app), "-m", *sweep, f"hydra/launcher={launcher}",
                           f"hydra.sweep.dir={sweep_dir}"], cwd=app.parent, capture_output=True, text=True)
    if done.returncode != 0:
        return done.returncode, done.stderr[-2000:], []
    if launcher == "basic":
        printed = done.stdout.splitlines()
    else:
        printed = [line for log in sorted(sweep_dir.glob("**/output.log")) for line in log.read_text().splitlines()]
    # the job log's console lines go to the sweep's stdout with one launcher, a run's output.log with the other
    printed = [line for line in printed if not HYDRA_LOG.match(line) and not WARNING.search(line)]
    runs = []
    for record in sorted(sweep_dir.glob("**/.hydra/overrides.yaml")):
        missing = [name for name in ("config.yaml", "hydra.yaml") if not (record.parent / name).is_file()]
        runs.append((record.read_text(), tuple(missing)))
    return 0, sorted(line for line in printed if line.strip()), sorted(runs)


if __name__ == "__main__":
    main()
