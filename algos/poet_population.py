"""POET's population: the pairs (a terrain and the agent that learns on it)
and the archive of every terrain admitted, and what a checkpoint holds of
them: each pair's ES state under ``pair<id>.``, and the master's books."""
from __future__ import annotations

from dataclasses import dataclass

from fiberrl.rl.walker_terrain import TerrainEncoding
from fiberrl.run import DamagedFile, require

from .es import ES, check_state


@dataclass
class Pair:
    id: int
    encoding: TerrainEncoding
    es: ES
    created: int                       # the iteration it was admitted in
    parent: int | None
    score: float = float("-inf")       # its agent on its terrain, at the last evaluation


@dataclass
class ArchivedTerrain:
    id: int
    encoding: TerrainEncoding
    created: int
    solved_at: int | None = None       # the iteration some agent first solved it


def pack(pairs, archive, master, extra: dict) -> tuple[dict, dict]:
    arrays, meta = {}, []
    for p in pairs:
        es_arrays, es_values = p.es.state()
        arrays.update({f"pair{p.id}.{k}": v for k, v in es_arrays.items()})
        meta.append(dict(id=p.id, encoding=p.encoding.to_dict(), created=p.created, parent=p.parent,
                         score=p.score, es=es_values))
    values = dict(extra, pairs=meta, rng=master.rng.bit_generator.state, version=master.version,
                  timesteps=master.timesteps, busy_s=master.busy_s, pool_s=master.pool_s,
                  archive=[dict(id=t.id, encoding=t.encoding.to_dict(), created=t.created, solved_at=t.solved_at)
                           for t in archive])
    return arrays, values


def pair_arrays(arrays: dict, pair_id: int) -> dict:
    """The arrays of one pair's optimiser, as ``ES.state()`` named them."""
    return {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(f"pair{pair_id}.")}


def unpack(arrays, values, master, cfg, noise, obs_shape) -> tuple[list, list]:
    pairs = []
    for meta in values["pairs"]:
        es = ES(arrays[f"pair{meta['id']}.theta"], cfg.es, noise, seed=0, obs_shape=obs_shape)
        es.restore(pair_arrays(arrays, meta["id"]), meta["es"])
        pairs.append(Pair(meta["id"], TerrainEncoding.from_dict(meta["encoding"]), es, meta["created"],
                          meta["parent"], meta["score"]))
    archive = [ArchivedTerrain(t["id"], TerrainEncoding.from_dict(t["encoding"]), t["created"], t["solved_at"])
               for t in values["archive"]]
    master.rng.bit_generator.state = values["rng"]
    master.version, master.timesteps = values["version"], values["timesteps"]
    master.busy_s, master.pool_s = values["busy_s"], values["pool_s"]
    return pairs, archive


PAIR_KEYS = ("id", "encoding", "created", "parent", "score", "es")
ARCHIVE_KEYS = ("id", "encoding", "created", "solved_at")


def check_checkpoint(arrays: dict, values: dict, size: int, obs_shape, optimizer: str = "adam") -> None:
    """Raise DamagedFile unless a checkpoint holds all that ``unpack`` and ``train`` read from it,
    for agents of ``size`` parameters."""
    require(arrays, values, value_names=("pairs", "archive", "rng", "version", "timesteps", "busy_s", "pool_s",
                                         "next_id", "time_s"))
    for meta in values["pairs"]:
        missing = [k for k in PAIR_KEYS if k not in meta]
        if missing:
            raise DamagedFile(f"a pair without {', '.join(missing)} in it")
        try:
            check_state(pair_arrays(arrays, meta["id"]), meta["es"], size, obs_shape, optimizer)
        except DamagedFile as exc:
            raise DamagedFile(f"pair {meta['id']}: {exc}") from None
        TerrainEncoding.from_dict(meta["encoding"])
    for terrain in values["archive"]:
        missing = [k for k in ARCHIVE_KEYS if k not in terrain]
        if missing:
            raise DamagedFile(f"an archived terrain without {', '.join(missing)} in it")
        TerrainEncoding.from_dict(terrain["encoding"])
    archived = {t["id"] for t in values["archive"]}
    homeless = [meta["id"] for meta in values["pairs"] if meta["id"] not in archived]
    if homeless:  # every pair's terrain is in the archive, where solving it is recorded
        raise DamagedFile(f"pairs {homeless} have no terrain in its archive")
