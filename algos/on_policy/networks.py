"""PPO's networks (CleanRL's): what PPO needs of one is ``forward(obs) -> (action
distribution, value)``; the Nature-CNN agent for image observations, separate tanh MLPs
for vector observations, a Gaussian with a state-independent log std for Box actions."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal


def layer_init(layer, std: float = 2 ** 0.5, bias_const: float = 0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """What PPO needs of a network: ``forward(obs) -> (action distribution, value)``."""
    continuous = False

    def get_value(self, x):
        return self(x)[1]

    def get_action_and_value(self, x, action=None, generator=None):
        dist, value = self(x)
        if action is None:
            if self.continuous:
                action = torch.normal(dist.loc, dist.scale, generator=generator)
            else:
                action = torch.multinomial(dist.probs, 1, generator=generator).squeeze(-1)
        logprob, entropy = dist.log_prob(action), dist.entropy()
        if self.continuous:  # independent dimensions
            logprob, entropy = logprob.sum(-1), entropy.sum(-1)
        return action, logprob, entropy, value


class CNNAgent(Agent):
    """CleanRL's Atari agent: the Nature DQN torso, shared by actor and critic."""

    def __init__(self, obs_shape, n_actions: int, scale: bool):
        super().__init__()
        self.scale = scale  # uint8 frames: divide by 255
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten())
        with torch.no_grad():
            flat = self.network(torch.zeros(1, *obs_shape)).shape[1]
        self.network.append(layer_init(nn.Linear(flat, 512)))
        self.network.append(nn.ReLU())
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def forward(self, x):
        hidden = self.network(x.float() / 255.0 if self.scale else x.float())
        return Categorical(logits=self.actor(hidden)), self.critic(hidden).squeeze(-1)


def mlp(n_in: int, hidden, n_out: int, out_std: float) -> nn.Sequential:
    layers, size = [], n_in
    for width in hidden:
        layers += [layer_init(nn.Linear(size, width)), nn.Tanh()]
        size = width
    return nn.Sequential(*layers, layer_init(nn.Linear(size, n_out), std=out_std))


class MLPAgent(Agent):
    """CleanRL's classic-control agent: separate tanh MLPs for actor and critic;
    for Box actions a Gaussian with a state-independent log std."""

    def __init__(self, obs_size: int, action_space: gym.Space, hidden, log_std_init: float = 0.0):
        super().__init__()
        self.continuous = isinstance(action_space, gym.spaces.Box)
        n_out = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        self.critic = mlp(obs_size, hidden, 1, 1.0)
        self.actor = mlp(obs_size, hidden, n_out, 0.01)
        if self.continuous:
            self.actor_logstd = nn.Parameter(torch.full((1, n_out), float(log_std_init)))

    def forward(self, x):
        x = x.float().flatten(1)
        out = self.actor(x)
        dist = Normal(out, self.actor_logstd.expand_as(out).exp()) if self.continuous else Categorical(logits=out)
        return dist, self.critic(x).squeeze(-1)

    def get_value(self, x):
        return self.critic(x.float().flatten(1)).squeeze(-1)


def make_agent(observation_space: gym.Space, action_space: gym.Space, hidden, log_std_init: float = 0.0) -> Agent:
    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(f"PPO here needs Box observations, not {observation_space}")
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)):
        raise ValueError(f"PPO here supports Discrete and Box actions, not {action_space}")
    if len(observation_space.shape) == 3:
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError("the CNN agent (image observations) supports Discrete actions only")
        return CNNAgent(observation_space.shape, int(action_space.n), observation_space.dtype == np.uint8)
    return MLPAgent(int(np.prod(observation_space.shape)), action_space, list(hidden), log_std_init)
