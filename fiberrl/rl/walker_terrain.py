"""Bipedal Walker on a terrain set by an encoding, for POET (Wang et al. 2019).

The walker, its physics, observations and rewards are gymnasium's
``BipedalWalker-v3``; only the terrain differs.  Grass segments alternate
with obstacles of the kinds the encoding enables, each drawn from its range:

- ``roughness``: how far each grass step may bend the ground (0: flat; 1:
  as bumpy as ``BipedalWalker-v3``);
- ``pit_gap``: a pit's width, in terrain steps, drawn from (low, high);
- ``stump_height``: a stump's height, in terrain steps, from (low, high);
- ``stair_height``/``stair_width``/``stair_steps``: a flight of stairs going up
  or down, ``stair_steps`` steps of up to ``stair_height`` terrain steps each.

The default encoding is flat ground with no obstacles.  Registered with
gymnasium as ``fiberrl/BipedalWalkerTerrain-v0``: ``gymnasium.make(ID,
encoding=TerrainEncoding(...))`` or ``encoding={"roughness": 2.0, ...}``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import gymnasium as gym
import numpy as np
from gymnasium.envs.box2d.bipedal_walker import (SCALE, TERRAIN_GRASS, TERRAIN_HEIGHT, TERRAIN_LENGTH,
                                                 TERRAIN_STARTPAD, TERRAIN_STEP, BipedalWalker)
from gymnasium.utils import EzPickle

ENV_ID = "fiberrl/BipedalWalkerTerrain-v0"
PIT_DEPTH = 4  # terrain steps, as in BipedalWalker-v3
OBSTACLE_COLOURS = ((255, 255, 255), (153, 153, 153))


@dataclass(frozen=True)
class TerrainEncoding:
    """What a terrain is made of; every field 0 means that obstacle is absent."""
    roughness: float = 0.0
    pit_gap_low: float = 0.0
    pit_gap_high: float = 0.0
    stump_height_low: float = 0.0
    stump_height_high: float = 0.0
    stair_height: float = 0.0
    stair_width: int = 4
    stair_steps: int = 0

    def __post_init__(self):
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"terrain encoding: {f.name}={getattr(self, f.name)} must not be negative")
        for name in ("pit_gap", "stump_height"):
            if getattr(self, f"{name}_low") > getattr(self, f"{name}_high"):
                raise ValueError(f"terrain encoding: {name}_low={getattr(self, f'{name}_low')} is above "
                                 f"{name}_high={getattr(self, f'{name}_high')}")
        if self.stair_width < 1:
            raise ValueError(f"terrain encoding: stair_width={self.stair_width} must be at least 1 step")
        if not (self.stair_steps > 0 and self.stair_height > 0):
            # one encoding per terrain: stairs of no steps or no height are no stairs, whatever their width
            for name, value in (("stair_height", 0.0), ("stair_steps", 0), ("stair_width", 4)):
                object.__setattr__(self, name, value)

    @property
    def has_pits(self) -> bool:
        return self.pit_gap_high > 0

    @property
    def has_stumps(self) -> bool:
        return self.stump_height_high > 0

    @property
    def has_stairs(self) -> bool:
        return self.stair_steps > 0 and self.stair_height > 0

    def vector(self) -> np.ndarray:
        """The encoding as numbers, in field order (novelty is a distance between these)."""
        return np.array([getattr(self, f.name) for f in fields(self)], dtype=np.float64)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TerrainEncoding":
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"terrain encoding: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)

    def describe(self) -> str:
        parts = [f"rough {self.roughness:.1f}"]
        if self.has_pits:
            parts.append(f"pits {self.pit_gap_low:.1f}-{self.pit_gap_high:.1f}")
        if self.has_stumps:
            parts.append(f"stumps {self.stump_height_low:.1f}-{self.stump_height_high:.1f}")
        if self.has_stairs:
            parts.append(f"stairs {self.stair_steps}x{self.stair_height:.1f}")
        return ", ".join(parts)


MIN_OBSTACLE_AREA = 1e-4


def _area(vertices) -> float:
    """A polygon's area (shoelace)."""
    pairs = zip(vertices, vertices[1:] + vertices[:1], strict=True)
    return abs(sum(x0 * y1 - x1 * y0 for (x0, y0), (x1, y1) in pairs)) / 2


class TerrainWalker(BipedalWalker):
    """``BipedalWalker-v3`` whose terrain ``encoding`` describes."""

    def __init__(self, render_mode: str | None = None, encoding: TerrainEncoding | dict | None = None):
        super().__init__(render_mode=render_mode, hardcore=False)
        if encoding is None:
            encoding = TerrainEncoding()
        elif isinstance(encoding, dict):
            encoding = TerrainEncoding.from_dict(encoding)
        self.encoding = encoding
        EzPickle.__init__(self, render_mode, encoding)

    def _obstacle(self, vertices) -> None:
        if _area(vertices) < MIN_OBSTACLE_AREA:
            return  # a stump drawn at height ~0 is flat ground, and Box2D refuses a polygon without area
        self.fd_polygon.shape.vertices = vertices
        body = self.world.CreateStaticBody(fixtures=self.fd_polygon)
        body.color1, body.color2 = OBSTACLE_COLOURS
        self.terrain.append(body)

    def _generate_terrain(self, hardcore):
        del hardcore  # the encoding decides
        enc, rng = self.encoding, self.np_random
        kinds = [k for k, on in (("pit", enc.has_pits), ("stump", enc.has_stumps), ("stairs", enc.has_stairs)) if on]
        self.terrain, self.terrain_x, self.terrain_y = [], [], []
        y, velocity = TERRAIN_HEIGHT, 0.0
        state, counter, fresh = "grass", TERRAIN_STARTPAD, False
        base_y, stair_rise, stair_width, stair_steps = y, 0.0, enc.stair_width, 0
        for i in range(TERRAIN_LENGTH):
            x = i * TERRAIN_STEP
            self.terrain_x.append(x)
            if state == "grass":
                velocity = 0.8 * velocity + 0.01 * np.sign(TERRAIN_HEIGHT - y)
                if i > TERRAIN_STARTPAD:
                    velocity += rng.uniform(-enc.roughness, enc.roughness) / SCALE
                y += velocity
            elif state == "pit" and fresh:
                gap = rng.uniform(enc.pit_gap_low, enc.pit_gap_high)
                span = math.ceil(1 + gap)  # terrain points from the left wall's edge to under the right wall
                bottom = y - PIT_DEPTH * TERRAIN_STEP
                self._obstacle([(x, y), (x + TERRAIN_STEP, y), (x + TERRAIN_STEP, bottom), (x, bottom)])
                # the right wall reaches the next grid point, so the ground line never shows inside the pit
                right = x + (1 + gap) * TERRAIN_STEP
                self._obstacle([(right, y), (x + (span + 1) * TERRAIN_STEP, y),
                                (x + (span + 1) * TERRAIN_STEP, bottom), (right, bottom)])
                base_y, counter = y, span + 2  # the ground stays down until it is inside the right wall
            elif state == "pit":
                y = base_y - PIT_DEPTH * TERRAIN_STEP if counter > 1 else base_y
            elif state == "stump" and fresh:
                height = rng.uniform(enc.stump_height_low, enc.stump_height_high)
                self._obstacle([(x, y), (x + TERRAIN_STEP, y), (x + TERRAIN_STEP, y + height * TERRAIN_STEP),
                                (x, y + height * TERRAIN_STEP)])
                counter = 1
            elif state == "stairs" and fresh:
                stair_rise = rng.uniform(0, enc.stair_height) * (1 if rng.random() > 0.5 else -1)
                stair_steps, base_y = enc.stair_steps, y
                for s in range(stair_steps):
                    left, right = x + s * stair_width * TERRAIN_STEP, x + (s + 1) * stair_width * TERRAIN_STEP
                    top = y + s * stair_rise * TERRAIN_STEP
                    self._obstacle([(left, top), (right, top), (right, top - TERRAIN_STEP),
                                    (left, top - TERRAIN_STEP)])
                counter = stair_steps * stair_width
            elif state == "stairs":
                done = stair_steps * stair_width - counter
                y = base_y + (done // stair_width) * stair_rise * TERRAIN_STEP
            fresh = False
            self.terrain_y.append(y)
            counter -= 1
            if counter <= 0:
                counter = int(rng.integers(TERRAIN_GRASS // 2, TERRAIN_GRASS))
                state = rng.choice(kinds) if state == "grass" and kinds else "grass"
                fresh = True
        self._terrain_edges()

    def _terrain_edges(self) -> None:
        """The ground line between the points, and its fill for rendering."""
        self.terrain_poly = []
        for i in range(TERRAIN_LENGTH - 1):
            edge = [(self.terrain_x[i], self.terrain_y[i]), (self.terrain_x[i + 1], self.terrain_y[i + 1])]
            self.fd_edge.shape.vertices = edge
            body = self.world.CreateStaticBody(fixtures=self.fd_edge)
            colour = (76, 255 if i % 2 == 0 else 204, 76)
            body.color1 = body.color2 = colour
            self.terrain.append(body)
            self.terrain_poly.append((edge + [(edge[1][0], 0), (edge[0][0], 0)], (102, 153, 76)))
        self.terrain.reverse()

    def obstacle_polygons(self) -> list[list[tuple[float, float]]]:
        """The obstacles of the current terrain in world units (for plots)."""
        polygons = []
        for body in self.terrain:
            for fixture in body.fixtures:
                if hasattr(fixture.shape, "vertices") and len(fixture.shape.vertices) == 4:
                    polygons.append([tuple(body.transform * v) for v in fixture.shape.vertices])
        return polygons


def make_terrain_env(encoding: TerrainEncoding | dict | None = None, max_episode_steps: int | None = None,
                     render_mode: str | None = None) -> gym.Env:
    options = {} if max_episode_steps is None else {"max_episode_steps": int(max_episode_steps)}
    return gym.make(ENV_ID, encoding=encoding, render_mode=render_mode, **options)


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=f"{__name__}:TerrainWalker", max_episode_steps=2000, reward_threshold=300)
