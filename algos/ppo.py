"""Proximal Policy Optimization (Schulman et al. 2017) with its environments
on remote env servers.

The algorithm is CleanRL's ``ppo_atari.py`` (and ``ppo_continuous_action.py``
for Box actions): clipped surrogate objective, GAE, optional value clipping,
entropy bonus, gradient-norm clipping, learning-rate annealing, several
epochs of minibatches over each rollout.  What differs is where the
environments live: ``workers`` env servers (``fiberrl.rl.env_servers``), each a
job-backed process stepping ``envs_per_worker`` environments, so simulation
scales past one machine while the learner (on a GPU when there is one)
batches inference over all of them.

Episode ends follow gymnasium: a *terminated* episode has no future, a
*truncated* one (a time limit, or an env server lost mid-episode) does, so
its last step's reward gets ``gamma * V(final observation)`` added before GAE
treats the step as the episode's last.

Determinism: the learner draws every random number from seeded generators
and env ``i`` resets its ``k``-th episode with a seed derived from (seed, i,
k) (an Atari env: from a snapshot of its emulator), so a run is a function
of its settings (on one machine, with one torch thread count), however its
envs are split over servers.  A checkpoint holds the learner's state and
each env's actions since its episode began; resuming replays them into
fresh env servers, so a resumed run computes what the uninterrupted one
would have.  A lost env server is the exception: its replacement starts
new episodes with new seeds; so is the EnvPool engine, whose envs cannot be
replayed.

Async rollouts (``algo.async_rollouts``): a thread collects the next rollout
with a copy of the policy each update starts from while the update trains,
so each update learns from data one policy old (the ratio is to the policy
that acted, as Sample Factory's PPO); a checkpoint then holds that rollout
too, and a resume stays exact.
"""
from __future__ import annotations

import copy
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal

from fiberrl.algorithm import RESUME_MAY_CHANGE, Algorithm, LoadedPolicy
from fiberrl.rl import envpool_engine
from fiberrl.rl.atari import NotAtari
from fiberrl.rl.env_servers import Episode, EnvSpec, RemoteEnvs, SlotHistory
from fiberrl.run import DamagedFile, require
from fiberrl.validation import (
    ANY,
    Rule,
    UsageError,
    at_least,
    between,
    check_fields,
    finite,
    layer_sizes,
    non_negative,
    one_of,
    optional,
    positive,
    shown,
)

log = logging.getLogger("fiberrl")

# torch threads of a CPU learner while it steps the envs: its inference batches are a few rows, and
# the OpenMP threads of a second one spin after each op on the cores the env servers need.  Measured
# on 2 cores, a rollout of the BipedalWalker preset (32 envs on 2 servers) 10-12 s -> 6 s, of Breakout's
# defaults 0.83 -> 0.67 s; the update keeps every thread
ROLLOUT_THREADS = 1


@dataclass
class Config:
    """The hyperparameters of PPO; also the Hydra schema of ``algo=ppo``.  The
    defaults are CleanRL's ``ppo_atari.py`` (8 envs with the app's ``workers=2``);
    ``+experiment=ppo_bipedal_walker`` has its continuous-control settings."""
    name: str = "ppo"
    total_timesteps: int = 10_000_000  # env steps over all envs; sets the number of updates and the lr schedule
    learning_rate: float = 2.5e-4      # Adam step size (at the start, when annealed)
    num_steps: int = 128               # steps per env per rollout; a batch is workers * envs_per_worker * num_steps
    envs_per_worker: int = 4           # envs each env server steps
    anneal_lr: bool = True             # decay the learning rate linearly to 0 over the run
    gamma: float = 0.99                # discount
    gae_lambda: float = 0.95           # GAE's lambda
    num_minibatches: int = 4           # minibatches per epoch; must divide the batch
    update_epochs: int = 4             # passes over each rollout
    norm_adv: bool = True              # normalise advantages per minibatch
    clip_coef: float = 0.1             # surrogate clipping (and value clipping) range
    clip_vloss: bool = True            # clip the value loss as the PPO paper's code does
    ent_coef: float = 0.01             # entropy bonus
    vf_coef: float = 0.5               # value loss weight
    max_grad_norm: float = 0.5         # gradient norm clipping
    target_kl: float | None = None     # stop an update's epochs once the approximate KL passes this
    norm_obs: bool = False             # running mean/std normalisation of observations (continuous control)
    norm_reward: bool = False          # scale rewards by the std of the discounted return (continuous control)
    obs_clip: float = 10.0             # normalised observations are clipped to +-obs_clip
    reward_clip: float = 10.0          # normalised rewards are clipped to +-reward_clip
    hidden: list[int] = field(default_factory=lambda: [64, 64])  # MLP sizes for vector observations
    log_std_init: float = 0.0          # the Gaussian policy's log std at the start (Box actions), as SB3's
    std_never_rises: bool = False      # each update may lower the Gaussian's std but not raise it (Box actions):
                                       # late in a run a rising std can walk the mean action off what it found
    device: str = "auto"               # the learner's: "auto" (cuda when there is one), "cpu", "cuda"
    checkpoint_every: int = 50         # updates between checkpoints (and one at the end)
    eval_every: int = 100              # updates between evaluations of the policy (0: none)
    eval_episodes: int = 5             # episodes per evaluation, on the learner; their mean is eval_reward
    eval_deterministic: bool = False   # evaluate the mean action (argmax if discrete), as SB3's zoo scores; else sample
    stop_reward: float | None = None   # stop once eval_reward reaches this
    env_timeout: float = 60.0          # seconds an env server may take to step before it is replaced
    async_rollouts: bool = False       # step the next rollout with the policy before each update while the
                                       # update trains (Sample Factory's, IMPALA's): each update learns from
                                       # data one policy old, its ratio taken to the policy that acted


# what each field may hold beyond its type (fiberrl.validation); check_settings adds what they need together
RULES = {
    "name": one_of("ppo").because("algo=<name> chooses the algorithm"),
    "total_timesteps": at_least(1),
    "learning_rate": positive(),
    "num_steps": at_least(1).because("steps per env per rollout"),
    "envs_per_worker": Rule(lambda envs: envs >= 1, "each env server needs at least one env"),
    "anneal_lr": ANY,
    "gamma": between(0, 1),
    "gae_lambda": between(0, 1),
    "num_minibatches": at_least(1),
    "update_epochs": at_least(1),
    "norm_adv": ANY,
    "clip_coef": positive(),
    "clip_vloss": ANY,
    "ent_coef": non_negative(),
    "vf_coef": positive().because("GAE needs a trained critic"),
    "max_grad_norm": positive(),
    "target_kl": optional(positive(), "all update_epochs"),
    "norm_obs": ANY,
    "norm_reward": ANY,
    "obs_clip": positive(),
    "reward_clip": positive(),
    "hidden": layer_sizes(),
    "log_std_init": finite(),
    "std_never_rises": ANY,
    "device": one_of("auto", "cpu", "cuda"),
    "checkpoint_every": at_least(1),
    "eval_every": at_least(0).because("0: no evaluation"),
    "eval_episodes": at_least(0).because("0: no evaluation"),
    "eval_deterministic": ANY,
    "stop_reward": optional(finite(), "no early stop"),
    "env_timeout": positive(),
    "async_rollouts": ANY,
}


# --- the networks ------------------------------------------------------------

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


class RunningMeanStd:
    """Mean and variance of a stream of batches (Chan et al.'s parallel update), as gymnasium's."""

    def __init__(self, shape=()):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, batch: np.ndarray) -> None:
        mean, var, n = batch.mean(axis=0), batch.var(axis=0), batch.shape[0]
        delta, total = mean - self.mean, self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + var * n + np.square(delta) * self.count * n / total) / total
        self.count = total

    def normalize(self, x: np.ndarray, clip: float) -> np.ndarray:
        return np.clip((x - self.mean) / np.sqrt(self.var + 1e-8), -clip, clip).astype(np.float32)


# --- advantages ---------------------------------------------------------------

def bootstrap_truncated(rewards: np.ndarray, final_values: dict, gamma: float) -> np.ndarray:
    """Rewards with ``gamma * V(final obs)`` added where an episode was truncated:
    its return goes on past the cut, and GAE will treat the step as the last."""
    rewards = rewards.copy()
    for i, value in final_values.items():
        rewards[i] += gamma * value
    return rewards


def gae(rewards, values, ends, last_value, gamma: float, gae_lambda: float):
    """(advantages, returns) for a rollout of ``T`` steps of ``N`` envs (tensors
    ``(T, N)``): ``ends[t]`` says an episode ended at step t (terminated, or
    truncated with its bootstrap already in ``rewards[t]``); ``last_value`` is
    V of the observation after the last step."""
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(last_value)
    for t in reversed(range(rewards.shape[0])):
        next_value = last_value if t == rewards.shape[0] - 1 else values[t + 1]
        goes_on = 1.0 - ends[t]
        delta = rewards[t] + gamma * next_value * goes_on - values[t]
        running = delta + gamma * gae_lambda * goes_on * running
        advantages[t] = running
    return advantages, advantages + values


# --- the update ------------------------------------------------------------------

def ppo_update(agent: Agent, optimizer, batch: dict, algo, rng: np.random.Generator) -> dict:
    """``update_epochs`` passes of minibatch steps on the clipped objective; returns the losses."""
    size = batch["obs"].shape[0]
    minibatch = size // algo.num_minibatches
    log_std = agent.actor_logstd if algo.std_never_rises and getattr(agent, "continuous", False) else None
    # capped once per update, not per minibatch step: capping each step would keep every chance fall of the
    # noisy step and drop every rise, and walk the std down to nothing (seen: std 0.6 -> 0.06 in 3.5M steps)
    log_std_before = log_std.detach().clone() if log_std is not None else None
    clipfracs = []
    for _epoch in range(algo.update_epochs):
        order = torch.as_tensor(rng.permutation(size), device=batch["obs"].device)
        for start in range(0, size, minibatch):
            mb = order[start:start + minibatch]
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(batch["obs"][mb], batch["actions"][mb])
            logratio = newlogprob - batch["logprobs"][mb]
            ratio = logratio.exp()
            with torch.no_grad():
                old_approx_kl = (-logratio).mean()
                approx_kl = ((ratio - 1) - logratio).mean()  # http://joschu.net/blog/kl-approx.html
                clipfracs.append(((ratio - 1.0).abs() > algo.clip_coef).float().mean().item())

            advantages = batch["advantages"][mb]
            if algo.norm_adv:
                advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
            pg_loss = torch.max(-advantages * ratio,
                                -advantages * torch.clamp(ratio, 1 - algo.clip_coef, 1 + algo.clip_coef)).mean()

            returns, old_values = batch["returns"][mb], batch["values"][mb]
            if algo.clip_vloss:
                clipped = old_values + torch.clamp(newvalue - old_values, -algo.clip_coef, algo.clip_coef)
                v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (clipped - returns) ** 2).mean()
            else:
                v_loss = 0.5 * ((newvalue - returns) ** 2).mean()

            entropy_loss = entropy.mean()
            loss = pg_loss - algo.ent_coef * entropy_loss + v_loss * algo.vf_coef
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), algo.max_grad_norm)
            optimizer.step()
        if algo.target_kl is not None and approx_kl > algo.target_kl:
            break
    if log_std is not None:
        with torch.no_grad():
            torch.minimum(log_std, log_std_before, out=log_std)

    y_pred, y_true = batch["values"].cpu().numpy(), batch["returns"].cpu().numpy()
    var_y = np.var(y_true)
    explained_var = None if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)
    return {"losses/value_loss": v_loss.item(), "losses/policy_loss": pg_loss.item(),
            "losses/entropy": entropy_loss.item(), "losses/old_approx_kl": old_approx_kl.item(),
            "losses/approx_kl": approx_kl.item(), "losses/clipfrac": float(np.mean(clipfracs)),
            "losses/explained_variance": explained_var}


# --- acting outside training: evaluation episodes ------------------------------------

class Policy:
    """A trained agent as evaluation runs it: observations normalised as in
    training, actions sampled from the policy (as CleanRL evaluates PPO) or,
    ``deterministic``, its most likely action (as Stable-Baselines3 does)."""

    def __init__(self, agent: Agent, action_space: gym.Space, obs_rms: RunningMeanStd | None, obs_clip: float,
                 atari: bool, device: torch.device, deterministic: bool = False):
        self.agent, self.action_space, self.obs_rms, self.obs_clip = agent.eval(), action_space, obs_rms, obs_clip
        self.atari, self.device, self.deterministic = atari, device, deterministic

    def act(self, obs, generator: torch.Generator | None = None):
        obs = np.asarray(obs)[None]
        if self.obs_rms is not None:
            obs = self.obs_rms.normalize(obs, self.obs_clip)
        obs = torch.as_tensor(obs, device=self.device)
        with torch.no_grad():
            if self.deterministic:
                dist, _ = self.agent(obs)
                action = dist.mean if self.agent.continuous else dist.probs.argmax(-1)
            else:
                action = self.agent.get_action_and_value(obs, generator=generator)[0]
        return env_actions(action, self.action_space)[0]


def run_episode(env: gym.Env, policy: Policy, seed: int, on_step=None) -> tuple[float, int]:
    """One whole episode, reset and sampled with ``seed``: (return, length).  On
    Atari a whole game (a lost life resets inside it), with the game's own
    unclipped score and its length in frames, as the training metrics count them."""
    generator = torch.Generator(policy.device).manual_seed(int(seed))
    obs, _ = env.reset(seed=int(seed))
    if on_step is not None:
        on_step()
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(policy.act(obs, generator))
        total, steps = total + float(reward), steps + 1
        if on_step is not None:
            on_step()
        if terminated or truncated:
            if "episode" in info:
                return float(info["episode"]["r"]), int(info["episode"]["l"])
            if not policy.atari:
                return total, steps
            obs, _ = env.reset()


def env_actions(action: torch.Tensor, space: gym.Space) -> np.ndarray:
    action = action.cpu().numpy()
    if isinstance(space, gym.spaces.Box):  # the Gaussian is unbounded; the env is not
        return np.clip(action, space.low, space.high).astype(space.dtype)
    return action


# --- a rollout -----------------------------------------------------------------------

@dataclass
class Rollout:
    """One rollout, as CleanRL keeps it: on the learner's device, (steps, envs, ...)."""
    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    rewards: torch.Tensor
    ends: torch.Tensor
    values: torch.Tensor
    next_value: torch.Tensor                      # the critic's value of the observation after the last step
    episodes: list = field(default_factory=list)  # whole episodes that ended in it
    seconds: float = 0.0                          # to collect it...
    inference_s: float = 0.0                      # ...of which the policy's forward passes

    TENSORS = ("obs", "actions", "logprobs", "rewards", "ends", "values", "next_value")


def new_rollout(num_steps: int, num_envs: int, observation_space, action_space, algo, device) -> Rollout:
    obs = torch.zeros((num_steps, num_envs, *observation_space.shape), device=device,
                      dtype=torch.uint8 if observation_space.dtype == np.uint8 and not algo.norm_obs
                      else torch.float32)
    actions = torch.zeros((num_steps, num_envs, *action_space.shape), device=device,
                          dtype=torch.float32 if isinstance(action_space, gym.spaces.Box) else torch.long)
    logprobs, rewards, ends, values = (torch.zeros((num_steps, num_envs), device=device) for _ in range(4))
    return Rollout(obs, actions, logprobs, rewards, ends, values, torch.zeros(num_envs, device=device))


@dataclass
class Cursor:
    """Where the envs are: their last observations, raw and as the agent sees them."""
    raw: np.ndarray
    obs: torch.Tensor


def collect(rollout: Rollout, actor: Agent, envs, learner: Learner, cursor: Cursor, action_space, algo) -> None:
    """Fill ``rollout`` with ``algo.num_steps`` steps of every env from ``cursor`` on, ``actor`` acting."""
    began, inference = time.perf_counter(), 0.0
    rollout.episodes = []
    for step in range(algo.num_steps):
        rollout.obs[step] = cursor.obs
        t = time.perf_counter()
        with torch.no_grad():
            action, logprob, _, value = actor.get_action_and_value(cursor.obs)
        inference += time.perf_counter() - t
        rollout.actions[step], rollout.logprobs[step], rollout.values[step] = action, logprob, value
        result = envs.step(env_actions(action, action_space))

        ended = result.terminated | result.truncated
        reward = learner.scale(result.reward.astype(np.float64), ended)
        if result.final_obs:  # truncated episodes: their value goes on past the cut
            index = sorted(result.final_obs)
            with torch.no_grad():
                final = actor.get_value(learner.observe(np.stack([result.final_obs[i] for i in index]), update=False))
            reward = bootstrap_truncated(reward, dict(zip(index, final.cpu().numpy(), strict=True)), algo.gamma)
        rollout.rewards[step] = torch.as_tensor(reward, dtype=torch.float32, device=rollout.rewards.device)
        rollout.ends[step] = torch.as_tensor(ended, dtype=torch.float32, device=rollout.ends.device)
        cursor.raw, cursor.obs = result.obs, learner.observe(result.obs)
        rollout.episodes += result.episodes
    with torch.no_grad():
        rollout.next_value = actor.get_value(cursor.obs)
    rollout.seconds, rollout.inference_s = time.perf_counter() - began, inference


def rollout_state(rollout: Rollout) -> tuple[dict, dict]:
    """A collected rollout not yet learnt from, as a checkpoint's arrays and values (async rollouts)."""
    arrays = {f"pending/{name}": getattr(rollout, name).cpu().numpy() for name in Rollout.TENSORS}
    return arrays, dict(pending_episodes=[list(e) for e in rollout.episodes],
                        pending_seconds=[rollout.seconds, rollout.inference_s])


def restore_rollout(rollout: Rollout, arrays: dict, values: dict) -> None:
    for name in Rollout.TENSORS:
        getattr(rollout, name).copy_(torch.as_tensor(arrays[f"pending/{name}"]))
    rollout.episodes = [Episode(int(env), float(reward), int(length))
                        for env, reward, length in values["pending_episodes"]]
    rollout.seconds, rollout.inference_s = map(float, values["pending_seconds"])


# --- the learner's state: what a checkpoint holds of it -------------------------------

def state_arrays(agent: Agent, obs_rms: RunningMeanStd | None) -> dict:
    """The policy as arrays: the network and the observation normaliser."""
    arrays = {f"agent/{k}": v.detach().cpu().numpy() for k, v in agent.state_dict().items()}
    if obs_rms is not None:
        arrays.update({"obs_rms/mean": obs_rms.mean, "obs_rms/var": obs_rms.var,
                       "obs_rms/count": np.array(obs_rms.count)})
    return arrays


def load_agent(agent: Agent, arrays: dict) -> None:
    state = {k[len("agent/"):]: torch.as_tensor(v) for k, v in arrays.items() if k.startswith("agent/")}
    try:
        agent.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(f"the saved network does not fit this env's agent: {str(exc).splitlines()[0]}") from None


def load_rms(arrays: dict, prefix: str) -> RunningMeanStd | None:
    if f"{prefix}/mean" not in arrays:
        return None
    rms = RunningMeanStd()
    rms.mean, rms.var, rms.count = arrays[f"{prefix}/mean"], arrays[f"{prefix}/var"], float(arrays[f"{prefix}/count"])
    return rms


class Learner:
    """The agent, its optimizer, the random generators and the normalisers:
    everything of the learner's side that the run's result depends on."""

    def __init__(self, agent: Agent, algo, num_envs: int, obs_shape, seed: int, device: torch.device):
        self.agent, self.algo, self.device = agent, algo, device
        self.optimizer = torch.optim.Adam(agent.parameters(), lr=algo.learning_rate, eps=1e-5)
        self.rng = np.random.Generator(np.random.PCG64([seed, 2]))  # minibatch order
        self.obs_rms = RunningMeanStd(obs_shape) if algo.norm_obs else None
        self.ret_rms = RunningMeanStd() if algo.norm_reward else None
        self.discounted = np.zeros(num_envs)  # each env's discounted return so far, for ret_rms

    def observe(self, raw: np.ndarray, update: bool = True) -> torch.Tensor:
        """Observations as the agent sees them (normalised when algo.norm_obs), on its device."""
        if self.obs_rms is not None:
            if update:
                self.obs_rms.update(raw)
            raw = self.obs_rms.normalize(raw, self.algo.obs_clip)
        return torch.as_tensor(raw, device=self.device)

    def scale(self, reward: np.ndarray, ended: np.ndarray) -> np.ndarray:
        """Rewards divided by the std of the discounted return, as gymnasium's NormalizeReward."""
        if self.ret_rms is None:
            return reward
        self.discounted = self.discounted * self.algo.gamma + reward
        self.ret_rms.update(self.discounted)
        self.discounted[ended] = 0.0
        return np.clip(reward / np.sqrt(self.ret_rms.var + 1e-8), -self.algo.reward_clip, self.algo.reward_clip)

    def state(self) -> tuple[dict, dict]:
        arrays = state_arrays(self.agent, self.obs_rms)
        optimizer = self.optimizer.state_dict()
        arrays.update({f"optim/{index}/{key}": torch.as_tensor(value).cpu().numpy()
                       for index, entry in optimizer["state"].items() for key, value in entry.items()})
        arrays.update(discounted=self.discounted, torch_rng=torch.get_rng_state().numpy())
        if self.ret_rms is not None:
            arrays.update({"ret_rms/mean": self.ret_rms.mean, "ret_rms/var": self.ret_rms.var,
                           "ret_rms/count": np.array(self.ret_rms.count)})
        if self.device.type == "cuda":
            arrays["cuda_rng"] = torch.cuda.get_rng_state(self.device).numpy()
        return arrays, dict(rng=self.rng.bit_generator.state, optim_groups=optimizer["param_groups"])

    def restore(self, arrays: dict, values: dict) -> None:
        load_agent(self.agent, arrays)
        state: dict = {}
        for key, value in arrays.items():
            if key.startswith("optim/"):
                _, index, name = key.split("/", 2)
                state.setdefault(int(index), {})[name] = torch.as_tensor(value)
        self.optimizer.load_state_dict({"state": state, "param_groups": values["optim_groups"]})
        self.obs_rms, self.ret_rms = load_rms(arrays, "obs_rms"), load_rms(arrays, "ret_rms")
        self.discounted = arrays["discounted"]
        torch.set_rng_state(torch.as_tensor(arrays["torch_rng"]))
        if self.device.type == "cuda" and "cuda_rng" in arrays:
            torch.cuda.set_rng_state(torch.as_tensor(arrays["cuda_rng"]), self.device)
        self.rng.bit_generator.state = values["rng"]


def env_state(envs) -> tuple[dict, dict]:
    """What rebuilds the envs where they are (``RemoteEnvs.history``), as arrays and values;
    envs that cannot say (a benchmark's vector env) give nothing, and a resume starts them afresh."""
    slots = envs.history()
    if slots is None:
        return {}, dict(env_episodes=None)
    arrays = {}
    for i, slot in enumerate(slots):
        arrays[f"env/{i}/actions"], arrays[f"env/{i}/life_resets"] = slot.actions, slot.life_resets
        if slot.start is not None:
            arrays[f"env/{i}/start"] = slot.start
    return arrays, dict(env_episodes=[s.episode for s in slots], env_generations=envs.generations)


def env_history(arrays: dict, values: dict) -> list[SlotHistory] | None:
    if values.get("env_episodes") is None:
        return None
    return [SlotHistory(episode, arrays[f"env/{i}/actions"], arrays[f"env/{i}/life_resets"],
                        arrays.get(f"env/{i}/start")) for i, episode in enumerate(values["env_episodes"])]


ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")  # what torch's Adam keeps per parameter


def check_checkpoint(arrays: dict, values: dict, learner: Learner, num_envs: int) -> None:
    """Raise DamagedFile unless a checkpoint holds all that ``train`` resumes from, for ``learner``
    and ``num_envs`` envs (one is only made after an update, so Adam has state for every parameter)."""
    shapes = {f"agent/{k}": tuple(v.shape) for k, v in learner.agent.state_dict().items()}
    shapes["discounted"] = (num_envs,)
    optimizer = [f"optim/{i}/{name}" for i in range(len(learner.optimizer.param_groups[0]["params"]))
                 for name in ADAM_STATE]
    normalisers = [f"{prefix}/{name}" for prefix, rms in (("obs_rms", learner.obs_rms), ("ret_rms", learner.ret_rms))
                   if rms is not None for name in ("mean", "var", "count")]
    require(arrays, values, [*shapes, *optimizer, *normalisers, "torch_rng"],
            ["rng", "optim_groups", "global_step", "time_s", "best", "env_server_restarts"])
    wrong = [f"{k} of shape {arrays[k].shape}, not {shape}" for k, shape in shapes.items() if arrays[k].shape != shape]
    if wrong:
        raise DamagedFile(f"it holds {', '.join(wrong)}")
    if any(k.startswith("pending/") for k in arrays):  # async rollouts: the rollout collected during the update
        require(arrays, values, [f"pending/{name}" for name in Rollout.TENSORS],
                ["pending_episodes", "pending_seconds"])
    episodes = values.get("env_episodes")
    if episodes is not None:
        require(arrays, values, ["next_obs", *(f"env/{i}/{name}" for i in range(len(episodes))
                                               for name in ("actions", "life_resets"))], ["env_generations"])


# --- training ---------------------------------------------------------------------

def check_settings(cfg) -> None:
    """algo.* as RULES says, then what the settings need together and of the env; raises UsageError."""
    check_fields(cfg.algo, RULES, "algo.")
    algo = cfg.algo
    if algo.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("algo.device=cuda: no CUDA device is available here (algo.device=auto uses one when there is)")
    if algo.stop_reward is not None and not (algo.eval_every and algo.eval_episodes):
        raise UsageError(f"algo.stop_reward={algo.stop_reward} is compared with the eval reward, which "
                         f"algo.eval_every={algo.eval_every} and algo.eval_episodes={algo.eval_episodes} never "
                         f"measure; set both >= 1")
    batch = cfg.workers * algo.envs_per_worker * algo.num_steps
    if batch % algo.num_minibatches:
        raise UsageError(f"a batch of {batch} steps (workers={cfg.workers} x algo.envs_per_worker="
                         f"{algo.envs_per_worker} x algo.num_steps={algo.num_steps}) does not split into "
                         f"algo.num_minibatches={algo.num_minibatches} equal minibatches")
    if algo.total_timesteps < batch:
        raise UsageError(f"algo.total_timesteps={algo.total_timesteps} is less than one batch ({batch} steps)")
    probe_spaces(env_spec(cfg))


def env_spec(cfg) -> EnvSpec:
    env = cfg.env
    atari = bool(env.get("atari", False))
    return EnvSpec(env.id, dict(env.kwargs), env.max_episode_steps, atari,
                   env_engine(env.get("engine", "auto"), env.id, dict(env.kwargs), env.max_episode_steps, atari),
                   int(env.get("envpool_threads", 1)), bool(env.get("new_env_per_episode", True)))


def env_engine(requested: str, env_id: str, kwargs: dict, max_episode_steps: int | None, atari: bool) -> str:
    """What steps the env servers' envs: ``env.engine=auto`` is EnvPool when it is installed and can
    make this env as the gymnasium path does, gymnasium otherwise."""
    if requested == "gymnasium":
        return requested
    why = envpool_engine.unavailable()
    if why is None:
        try:
            envpool_engine.task(env_id, kwargs, max_episode_steps, atari)
            return "envpool"
        except envpool_engine.NoEnvPoolTask as exc:
            why = str(exc)
    if requested == "envpool":
        raise UsageError(f"env.engine=envpool: {why}; env.engine=gymnasium (or auto) steps {env_id} with gymnasium")
    return "gymnasium"


def probe_spaces(spec: EnvSpec) -> tuple[gym.Space, gym.Space]:
    """The env's spaces, from one made here: a bad env setting fails before any server starts."""
    try:
        env = spec.make()
    except NotAtari as exc:
        raise UsageError(str(exc)) from None
    except TypeError as exc:  # gymnasium's message names the env and the argument it does not take
        raise UsageError(f"env.kwargs={shown(spec.kwargs)}: {str(exc).splitlines()[0]}") from None
    try:
        make_agent(env.observation_space, env.action_space, [1])
    except ValueError as exc:
        raise UsageError(f"env {spec.id}: {exc}") from None
    finally:
        env.close()
    return env.observation_space, env.action_space


def remote_envs(cfg, spec: EnvSpec, history=None, generations=None) -> RemoteEnvs:
    return RemoteEnvs(spec, cfg.workers, cfg.algo.envs_per_worker, cfg.seed, timeout=cfg.algo.env_timeout,
                      history=history, generations=generations)


def train(cfg, run, on_iteration=None, make_envs=remote_envs) -> dict:
    """Run PPO as ``cfg`` (the composed app config) says, writing into ``run``
    (a ``fiberrl.run.RunDirectory``).  ``on_iteration(update, envs)`` is called
    after every update.  ``make_envs(cfg, spec, history, generations)`` builds the
    batch of envs (``RemoteEnvs`` by default; benchmarks pass another)."""
    algo = cfg.algo
    check_settings(cfg)
    device = torch.device("cuda" if algo.device == "cuda" or (algo.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    spec = env_spec(cfg)
    observation_space, action_space = probe_spaces(spec)
    num_envs = cfg.workers * algo.envs_per_worker
    batch_size = num_envs * algo.num_steps
    num_updates = algo.total_timesteps // batch_size

    torch.manual_seed(cfg.seed)
    agent = make_agent(observation_space, action_space, algo.hidden, algo.log_std_init).to(device)
    learner = Learner(agent, algo, num_envs, observation_space.shape, cfg.seed, device)
    agent, optimizer = learner.agent, learner.optimizer

    start, global_step, elapsed, best, restarts_before = 0, 0, 0.0, -np.inf, 0
    history, generations, saved_obs = None, None, None
    checkpoint = run.resume(lambda arrays, values: check_checkpoint(arrays, values, learner, num_envs))
    if checkpoint is not None:
        arrays, stored = checkpoint
        learner.restore(arrays, stored)
        start, global_step, elapsed = stored["iteration"] + 1, stored["global_step"], stored["time_s"]
        best, restarts_before = stored["best"], stored["env_server_restarts"]
        history = env_history(arrays, stored)
        if history is not None:
            generations, saved_obs = stored["env_generations"], arrays["next_obs"]
        run.console.print(f"resumed {run.path} after update {stored['iteration']} ({global_step:,} steps)")

    # two rollouts with async rollouts: the next one is collected, by a copy of the agent as it was before the
    # update, while the update learns from the other
    rollouts = [new_rollout(algo.num_steps, num_envs, observation_space, action_space, algo, device)
                for _ in range(2 if algo.async_rollouts else 1)]
    actor = copy.deepcopy(agent) if algo.async_rollouts else agent
    pending = checkpoint is not None and "pending/obs" in checkpoint[0]
    if pending:
        restore_rollout(rollouts[start % 2], *checkpoint)

    summary = dict(updates=start, global_step=global_step, episodic_return=None, eval_reward=None,
                   best_eval_reward=best, env_server_restarts=restarts_before)
    envs = make_envs(cfg, spec, history, generations)
    eval_env = None
    learner_threads = torch.get_num_threads()
    collector = ThreadPoolExecutor(1, thread_name_prefix="rollout") if algo.async_rollouts else None
    # a sync rollout steps on ROLLOUT_THREADS torch threads and gives the learner its threads back after
    one_thread_rollout = device.type == "cpu" and not algo.async_rollouts
    try:
        raw_obs = envs.reset()
        if saved_obs is not None and not np.array_equal(raw_obs, saved_obs):
            log.warning("the envs rebuilt from the checkpoint are not where the run left them (an env that is not "
                        "a function of its seed and actions?); the resumed run goes on from where they are")
        # the uninterrupted run's normaliser had seen these observations before its checkpoint
        cursor = Cursor(raw_obs, learner.observe(raw_obs, update=checkpoint is None))
        if algo.async_rollouts and device.type == "cpu":
            torch.set_num_threads(max(1, learner_threads - ROLLOUT_THREADS))  # the rest is the rollout's
        began, session_start, session_step = time.perf_counter() - elapsed, time.perf_counter(), global_step
        for update in range(start, num_updates):
            t0 = time.perf_counter()
            if algo.anneal_lr:
                optimizer.param_groups[0]["lr"] = (1.0 - update / num_updates) * algo.learning_rate
            rollout = rollouts[update % len(rollouts)]
            collected = algo.async_rollouts and (update > start or pending)  # while the last update trained
            if not collected:
                if one_thread_rollout:
                    torch.set_num_threads(ROLLOUT_THREADS)
                collect(rollout, actor, envs, learner, cursor, action_space, algo)
                if one_thread_rollout:
                    torch.set_num_threads(learner_threads)
            t_rollout = time.perf_counter() - t0
            global_step += batch_size
            episodes = rollout.episodes

            following = None
            if algo.async_rollouts and update + 1 < num_updates:
                actor.load_state_dict(agent.state_dict())  # the policy this update starts from acts next
                following = collector.submit(collect, rollouts[(update + 1) % 2], actor, envs, learner, cursor,
                                             action_space, algo)
            with torch.no_grad():
                advantages, returns = gae(rollout.rewards, rollout.values, rollout.ends, rollout.next_value,
                                          algo.gamma, algo.gae_lambda)
            batch = dict(obs=rollout.obs.reshape((-1, *observation_space.shape)),
                         actions=rollout.actions.reshape((-1, *action_space.shape)),
                         logprobs=rollout.logprobs.reshape(-1), advantages=advantages.reshape(-1),
                         returns=returns.reshape(-1), values=rollout.values.reshape(-1))
            losses = ppo_update(agent, optimizer, batch, algo, learner.rng)
            t_update = time.perf_counter() - t0 - t_rollout
            t_wait = 0.0
            if following is not None:
                following.result()  # a failure of the collection (an env server beyond replacing) raises here
                t_wait = time.perf_counter() - t0 - t_rollout - t_update

            eval_reward = None
            if algo.eval_every and algo.eval_episodes and ((update + 1) % algo.eval_every == 0
                                                          or update + 1 == num_updates):
                eval_env = eval_env or spec.make()
                policy = Policy(agent, action_space, learner.obs_rms, algo.obs_clip, spec.atari, device,
                                algo.eval_deterministic)
                # seeds of their own: evaluating leaves the training's random numbers alone
                eval_reward = float(np.mean([run_episode(eval_env, policy, 1_000_000_007 * (update + 1) + i)[0]
                                             for i in range(algo.eval_episodes)]))
                agent.train()
                if eval_reward > best:
                    best = eval_reward
                    run.save_best(state_arrays(agent, learner.obs_rms),
                                  dict(iteration=update, global_step=global_step, eval_reward=eval_reward))

            now = time.perf_counter()
            returns_ = [e.reward for e in episodes]
            metrics = {"iteration": update, "timesteps": global_step, "global_step": global_step,
                       "time_s": now - began, "iteration_s": now - t0, "rollout_s": t_rollout,
                       "update_s": t_update, "rollout_wait_s": t_wait,
                       "rollout_collect_s": rollout.seconds, "rollout_inference_s": rollout.inference_s,
                       "charts/SPS": int((global_step - session_step) / (now - session_start)),
                       "charts/learning_rate": optimizer.param_groups[0]["lr"],
                       "charts/episodic_return": float(np.mean(returns_)) if returns_ else None,
                       "charts/episodic_length": float(np.mean([e.length for e in episodes])) if episodes else None,
                       "charts/episodes": len(episodes),
                       "charts/env_server_restarts": restarts_before + envs.restarts,
                       **losses, "eval_reward": eval_reward}
            run.log(metrics, line=progress_line(metrics, num_updates))
            solved = algo.stop_reward is not None and eval_reward is not None and eval_reward >= algo.stop_reward
            if (update + 1) % algo.checkpoint_every == 0 or update + 1 == num_updates or solved:
                arrays, saved = learner.state()
                env_arrays, env_values = env_state(envs)
                arrays.update(env_arrays, next_obs=cursor.raw)
                saved.update(env_values, iteration=update, global_step=global_step, time_s=metrics["time_s"],
                             best=best, env_server_restarts=restarts_before + envs.restarts)
                if following is not None:  # the rollout the next update learns from, collected already
                    pending_arrays, pending_values = rollout_state(rollouts[(update + 1) % 2])
                    arrays.update(pending_arrays)
                    saved.update(pending_values)
                run.save_checkpoint(update, arrays, saved)
            summary.update(updates=update + 1, global_step=global_step, eval_reward=eval_reward,
                           best_eval_reward=best, env_server_restarts=restarts_before + envs.restarts,
                           episodic_return=metrics["charts/episodic_return"])
            if on_iteration is not None:
                on_iteration(update, envs)
            if solved:
                run.console.print(f"eval reward {eval_reward:.1f} reached algo.stop_reward={algo.stop_reward}")
                break
    finally:
        if collector is not None:
            collector.shutdown(cancel_futures=True)
        torch.set_num_threads(learner_threads)
        envs.close()
        if eval_env is not None:
            eval_env.close()
    summary["agent"] = agent
    return summary


def progress_line(m: dict, num_updates: int) -> str:
    def num(key, fmt):
        value = m.get(key)
        return format(value, fmt) if isinstance(value, (int, float)) else "-"
    return (f"[bold]update {m['iteration'] + 1:>5}/{num_updates}[/]  steps {m['global_step']:,}  "
            f"return {num('charts/episodic_return', '.2f')}  eval [bold]{num('eval_reward', '.2f')}[/]  "
            f"SPS {m['charts/SPS']}  restarts {m['charts/env_server_restarts']}  {m['time_s']:.0f} s")


# --- for fiberrl.evaluate --------------------------------------------------------------

def load_policy(config: dict, arrays: dict, values: dict) -> LoadedPolicy:
    """The agent saved in ``arrays`` by the run of ``config``, acting as its evaluations did."""
    env_cfg, algo = config["env"], config["algo"]
    spec = EnvSpec(env_cfg["id"], dict(env_cfg.get("kwargs") or {}), env_cfg.get("max_episode_steps"),
                   bool(env_cfg.get("atari", False)))
    env = spec.make()
    try:
        agent = make_agent(env.observation_space, env.action_space, algo.get("hidden", [64, 64]))
        action_space = env.action_space
    finally:
        env.close()
    if not any(k.startswith("agent/") for k in arrays):
        raise ValueError("it holds no agent/ parameters: not a PPO policy")
    load_agent(agent, arrays)
    policy = Policy(agent, action_space, load_rms(arrays, "obs_rms"), float(algo.get("obs_clip", 10.0)), spec.atari,
                    torch.device("cpu"), bool(algo.get("eval_deterministic", False)))
    return LoadedPolicy(policy, lambda env, seed, on_step=None: run_episode(env, policy, seed, on_step))


ALGORITHM = Algorithm(
    name="ppo", config=Config, rules=RULES, check_settings=check_settings, train=train, load_policy=load_policy,
    worker_modules=("fiberrl.rl.env_servers",),  # what the env servers run (not torch: only the learner needs it)
    resume_may_change=frozenset({"checkpoint_every", "eval_every", "eval_episodes", "eval_deterministic",
                                 "stop_reward", "env_timeout"}),
    app_resume_may_change=RESUME_MAY_CHANGE - {"workers"},  # workers sets the number of envs
    takes_atari=True, has_env_servers=True)
