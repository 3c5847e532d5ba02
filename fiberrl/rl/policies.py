"""Policies whose parameters are one flat float32 vector, as ES needs.

``MLPPolicy`` is plain numpy: a few small matrix products per step, no
framework start-up in the workers.  ``TorchMLPPolicy`` is the same network
as a ``torch.nn.Module`` for users who want to swap in their own module.
Both map an observation (already normalised) to an action of the env's
action space: argmax of the outputs for a discrete space, outputs squashed by
tanh into the bounds for a box.
"""
from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np


def _action_size(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    raise ValueError(f"ES policies support Discrete and Box action spaces, not {space}")


class ActionMap:
    """Turns the network's outputs into an action of ``space``."""

    def __init__(self, space: gym.Space):
        self.discrete = isinstance(space, gym.spaces.Discrete)
        if not self.discrete:
            self.low = np.asarray(space.low, dtype=np.float32).ravel()
            self.high = np.asarray(space.high, dtype=np.float32).ravel()
            self.shape = space.shape

    def __call__(self, out: np.ndarray):
        if self.discrete:
            return int(np.argmax(out))
        squashed = np.tanh(out)
        return (self.low + (squashed + 1.0) * 0.5 * (self.high - self.low)).reshape(self.shape)


class MLPPolicy:
    """tanh MLP; ``params`` packs each layer's weight matrix then its bias."""

    def __init__(self, obs_size: int, action_space: gym.Space, hidden: tuple[int, ...] = (64, 64)):
        self.sizes = [int(obs_size), *map(int, hidden), _action_size(action_space)]
        self.action = ActionMap(action_space)
        self.shapes = []
        for n_in, n_out in itertools.pairwise(self.sizes):
            self.shapes += [(n_in, n_out), (n_out,)]
        self.num_params = sum(int(np.prod(s)) for s in self.shapes)
        self._layers: list[np.ndarray] = []

    def initial_params(self, rng: np.random.Generator) -> np.ndarray:
        """As OpenAI's ES: weight columns of norm 1 in the hidden layers and 0.01
        in the output layer (the first actions are near zero), zero biases."""
        parts = []
        for i, shape in enumerate(self.shapes):
            if len(shape) == 2:
                w = rng.standard_normal(shape).astype(np.float32)
                norm = 0.01 if i == len(self.shapes) - 2 else 1.0
                w *= norm / np.sqrt(np.square(w).sum(axis=0, keepdims=True))
                parts.append(w.ravel())
            else:
                parts.append(np.zeros(shape, dtype=np.float32))
        return np.concatenate(parts)

    def set_params(self, params: np.ndarray) -> None:
        params = np.asarray(params, dtype=np.float32)
        if params.shape != (self.num_params,):
            raise ValueError(f"this policy has {self.num_params} parameters, got an array of shape {params.shape}")
        self._layers, offset = [], 0
        for shape in self.shapes:
            n = int(np.prod(shape))
            self._layers.append(params[offset:offset + n].reshape(shape))
            offset += n

    def act(self, obs: np.ndarray):
        x = np.asarray(obs, dtype=np.float32).ravel()
        layers = self._layers
        last = len(layers) - 2
        for i in range(0, len(layers), 2):
            x = x @ layers[i] + layers[i + 1]
            if i < last:
                x = np.tanh(x)
        return self.action(x)


class TorchMLPPolicy:
    """The same network as a torch module (CPU, float32)."""

    def __init__(self, obs_size: int, action_space: gym.Space, hidden: tuple[int, ...] = (64, 64)):
        import torch

        self.torch = torch
        torch.set_num_threads(1)  # one episode per process: threads only contend
        sizes = [int(obs_size), *map(int, hidden), _action_size(action_space)]
        layers: list = []
        for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
            layers.append(torch.nn.Linear(n_in, n_out))
            if i < len(sizes) - 2:
                layers.append(torch.nn.Tanh())
        self.module = torch.nn.Sequential(*layers).eval()
        self.action = ActionMap(action_space)
        self.num_params = sum(p.numel() for p in self.module.parameters())

    def initial_params(self, rng: np.random.Generator) -> np.ndarray:
        generator = self.torch.Generator().manual_seed(int(rng.integers(2**62)))
        with self.torch.no_grad():
            for module in self.module:
                if isinstance(module, self.torch.nn.Linear):
                    self.torch.nn.init.orthogonal_(module.weight, generator=generator)
                    module.bias.zero_()
        return self.torch.nn.utils.parameters_to_vector(self.module.parameters()).detach().numpy().astype(np.float32)

    def set_params(self, params: np.ndarray) -> None:
        if np.shape(params) != (self.num_params,):
            raise ValueError(f"this policy has {self.num_params} parameters, got an array of shape {np.shape(params)}")
        with self.torch.no_grad():
            vector = self.torch.from_numpy(np.array(params, dtype=np.float32))
            self.torch.nn.utils.vector_to_parameters(vector, self.module.parameters())

    def act(self, obs: np.ndarray):
        with self.torch.no_grad():
            out = self.module(self.torch.from_numpy(np.asarray(obs, dtype=np.float32).ravel()))
        return self.action(out.numpy())


class RunningStat:
    """Running mean and std of observations, from sums (as OpenAI's ES)."""

    def __init__(self, shape, eps: float = 1e-2):
        self.sum = np.zeros(shape, dtype=np.float64)
        self.sumsq = np.full(shape, eps, dtype=np.float64)
        self.count = eps

    def increment(self, total, total_sq, count) -> None:
        self.sum += total
        self.sumsq += total_sq
        self.count += count

    @property
    def mean(self) -> np.ndarray:
        return (self.sum / self.count).astype(np.float32)

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(np.maximum(self.sumsq / self.count - np.square(self.sum / self.count), 1e-2)).astype(np.float32)

    @classmethod
    def from_sums(cls, total, total_sq, count) -> "RunningStat":
        stat = cls(np.shape(total), eps=0.0)
        stat.increment(total, total_sq, count)
        return stat


POLICIES = {"mlp": MLPPolicy, "torch_mlp": TorchMLPPolicy}


def make_policy(kind: str, observation_space: gym.Space, action_space: gym.Space, hidden) -> MLPPolicy:
    if kind not in POLICIES:
        raise ValueError(f"unknown policy {kind!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[kind](int(np.prod(observation_space.shape)), action_space, tuple(hidden))


def run_episode(env, policy, obs_mean, obs_std, obs_clip: float, seed: int, record: bool = False, on_step=None,
                max_steps: int | None = None, reward_clip: float | None = None):
    """One episode of ``policy`` on observations normalised by ``obs_mean``/``obs_std``
    and clipped to +-``obs_clip``, cut after ``max_steps`` steps when given, each step's
    reward clipped to +-``reward_clip`` when given.  Returns (return, steps, observation
    sums): the sums, count included, only when ``record``, for a running normaliser.
    ``on_step()`` is called after the reset and after every step (to render)."""
    obs, _ = env.reset(seed=int(seed))
    if on_step is not None:
        on_step()
    total, steps = 0.0, 0
    sums = [np.zeros(obs.shape), np.zeros(obs.shape), 0] if record else None
    done = False
    while not done:
        if record:
            sums[0] += obs
            sums[1] += np.square(obs)
            sums[2] += 1
        action = policy.act(np.clip((obs - obs_mean) / obs_std, -obs_clip, obs_clip))
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward) if reward_clip is None else min(max(float(reward), -reward_clip), reward_clip)
        steps += 1
        done = terminated or truncated or steps == max_steps
        if on_step is not None:
            on_step()
    return total, steps, sums
