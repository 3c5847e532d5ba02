"""The benchmarks a performance claim rests on still run against the code as it is (a peer's stand-in that
fell behind an interface hung the ES scaling bench: its multiprocessing workers died in their initializer,
and multiprocessing's pool starts them again for ever)."""
import json
import subprocess

import pytest

from conftest import PYTHON, ROOT


@pytest.mark.slow
def test_the_es_scaling_bench_runs_its_simulated_part_and_its_multiprocessing_peer(tmp_path):
    out = subprocess.run([PYTHON, "experiments/micro/bench_es_scaling.py", "--quick", "--parts", "sim",
                          "--noise-size", "1000000", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "fiberrl pool phase / multiprocessing.Pool (spawn) map of the same ES tasks: 4:" in out.stdout
    rows = json.loads((tmp_path / "summary.json").read_text())["sim"]
    assert [r["workers"] for r in rows] == [4, 8] and all(r["peer_es"] > 0 for r in rows)
