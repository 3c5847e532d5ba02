"""POET's pictures: the terrains of the current population, and how the
run grew (ANNECS, terrains created, the hardest terrain solved, worker
utilisation) over its iterations."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the file-only backend
from matplotlib.patches import Polygon  # noqa: E402

from .walker_terrain import TerrainEncoding, make_terrain_env  # noqa: E402


def terrain_outline(encoding: TerrainEncoding, seed: int) -> tuple[list, list, list]:
    """(x, y) of the ground line and the obstacles' polygons of a terrain as an episode with ``seed`` sees it."""
    env = make_terrain_env(encoding)
    try:
        env.reset(seed=seed)
        walker = env.unwrapped
        return list(walker.terrain_x), list(walker.terrain_y), walker.obstacle_polygons()
    finally:
        env.close()


def plot_population(pairs: list[tuple[int, TerrainEncoding, float]], path, seed: int = 0) -> Path:
    """One panel per (id, terrain, score) pair, in the order given."""
    rows = max(len(pairs), 1)
    fig, axes = plt.subplots(rows, 1, figsize=(12, 1.6 * rows + 0.4), squeeze=False)
    for ax, (pair_id, encoding, score) in zip(axes[:, 0], pairs, strict=False):
        xs, ys, polygons = terrain_outline(encoding, seed)
        ax.fill_between(xs, ys, min(ys) - 2, color="#669944", linewidth=0)
        for polygon in polygons:
            ax.add_patch(Polygon(polygon, closed=True, facecolor="#999999", edgecolor="#555555", linewidth=0.5))
        ax.set_xlim(xs[0], xs[-1])
        ax.set_aspect("equal")
        ax.set_yticks([])
        ax.set_title(f"pair {pair_id}: {encoding.describe()}  (score {score:.0f})", fontsize=9, loc="left")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_progress(metrics: list[dict], path) -> Path:
    """ANNECS and terrains created, the hardest terrain solved, and utilisation, against iterations."""
    its = [m["iteration"] for m in metrics]
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    top.plot(its, [m["annecs"] for m in metrics], label="ANNECS")
    top.plot(its, [m["envs_created"] for m in metrics], label="terrains created", linestyle="--")
    top.plot(its, [m["active_pairs"] for m in metrics], label="active pairs", linestyle=":")
    top.legend(loc="upper left")
    top.set_ylabel("count")
    hardest = [(i, m["hardest_solved"]) for i, m in zip(its, metrics, strict=True) if m["hardest_solved"] is not None]
    if hardest:
        middle.step([i for i, _ in hardest], [h for _, h in hardest], where="post")
    middle.set_ylabel("hardest solved\n(share of bounds)")
    bottom.plot(its, [m["utilisation"] for m in metrics], label="busy / (workers x wall)")
    bottom.plot(its, [m["pool_utilisation"] for m in metrics], label="busy / (workers x time in the pool)",
                linestyle="--")
    bottom.set_ylim(0, 1.05)
    bottom.set_ylabel("worker utilisation")
    bottom.set_xlabel("POET iteration")
    bottom.legend(loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
