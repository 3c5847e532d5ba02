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

The networks are in ``on_policy/networks.py``.

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

Several learners (``algo.learners=K``, DD-PPO): ``train`` runs ``learn`` in
each of K Ring members (``on_policy.ring_learners``), each stepping its share
of the env servers; ``peers`` (``on_policy.peers``) is what they share at each
minibatch step and after each rollout.  A run of K learners is a function of
its settings and K (each learner samples its own actions).

Async rollouts (``algo.async_rollouts``): a thread collects the next rollout
with a copy of the policy each update starts from while the update trains,
so each update learns from data one policy old (the ratio is to the policy
that acted, as Sample Factory's PPO); a checkpoint then holds that rollout
too, and a resume stays exact.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fiberrl.algorithm import RESUME_MAY_CHANGE, Algorithm, LoadedPolicy
from fiberrl.rl.env_servers import EnvSpec
from fiberrl.training import TrainingLoop
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
    setting,
)

from .on_policy import checkpoint
from .on_policy.envs import env_spec, probe_spaces, remote_envs
from .on_policy.evaluation import Policy, evaluate, run_episode
from .on_policy.learner import Learner
from .on_policy.networks import Agent, CNNAgent, MLPAgent, make_agent  # noqa: F401 -- the networks are PPO's
from .on_policy.peers import SOLO
from .on_policy.ring_learners import check_learners, train_on_ring
from .on_policy.rollouts import Cursor, Rollouts

log = logging.getLogger("fiberrl")


@dataclass
class Config:
    """The hyperparameters of PPO; also the Hydra schema of ``algo=ppo``.  The
    defaults are CleanRL's ``ppo_atari.py`` (8 envs with the app's ``workers=2``);
    ``+experiment=ppo_bipedal_walker`` has its continuous-control settings."""
    name: str = setting("ppo", one_of("ppo").because("algo=<name> chooses the algorithm"))
    # env steps over all envs; sets the number of updates and the lr schedule
    total_timesteps: int = setting(10_000_000, at_least(1))
    learning_rate: float = setting(2.5e-4, positive())  # Adam step size (at the start, when annealed)
    # steps per env per rollout; a batch is workers * envs_per_worker * num_steps
    num_steps: int = setting(128, at_least(1).because("steps per env per rollout"))
    # envs each env server steps
    envs_per_worker: int = setting(4, Rule(lambda envs: envs >= 1, "each env server needs at least one env"))
    anneal_lr: bool = setting(True, ANY)  # decay the learning rate linearly to 0 over the run
    gamma: float = setting(0.99, between(0, 1))  # discount
    gae_lambda: float = setting(0.95, between(0, 1))  # GAE's lambda
    num_minibatches: int = setting(4, at_least(1))  # minibatches per epoch; must divide the batch
    update_epochs: int = setting(4, at_least(1))  # passes over each rollout
    norm_adv: bool = setting(True, ANY)  # normalise advantages per minibatch
    clip_coef: float = setting(0.1, positive())  # surrogate clipping (and value clipping) range
    clip_vloss: bool = setting(True, ANY)  # clip the value loss as the PPO paper's code does
    ent_coef: float = setting(0.01, non_negative())  # entropy bonus
    vf_coef: float = setting(0.5, positive().because("GAE needs a trained critic"))  # value loss weight
    max_grad_norm: float = setting(0.5, positive())  # gradient norm clipping
    # stop an update's epochs once the approximate KL passes this
    target_kl: float | None = setting(None, optional(positive(), "all update_epochs"))
    norm_obs: bool = setting(False, ANY)  # running mean/std normalisation of observations (continuous control)
    norm_reward: bool = setting(False, ANY)  # scale rewards by the std of the discounted return (continuous control)
    obs_clip: float = setting(10.0, positive())  # normalised observations are clipped to +-obs_clip
    reward_clip: float = setting(10.0, positive())  # normalised rewards are clipped to +-reward_clip
    hidden: list[int] = setting(rule=layer_sizes(), factory=lambda: [64, 64])  # MLP sizes for vector observations
    log_std_init: float = setting(0.0, finite())  # the Gaussian policy's log std at the start (Box actions), as SB3's
    # each update may lower the Gaussian's std but not raise it (Box actions): late in a run a rising std can
    # walk the mean action off what it found
    std_never_rises: bool = setting(False, ANY)
    # the learner's: "auto" (cuda when there is one), "cpu", "cuda"
    device: str = setting("auto", one_of("auto", "cpu", "cuda"))
    checkpoint_every: int = setting(50, at_least(1))  # updates between checkpoints (and one at the end)
    # updates between evaluations of the policy (0: none)
    eval_every: int = setting(100, at_least(0).because("0: no evaluation"))
    # episodes per evaluation, on the learner; their mean is eval_reward
    eval_episodes: int = setting(5, at_least(0).because("0: no evaluation"))
    # evaluate the mean action (argmax if discrete), as SB3's zoo scores; else sample
    eval_deterministic: bool = setting(False, ANY)
    stop_reward: float | None = setting(None, optional(finite(), "no early stop"))  # stop once eval_reward reaches this
    env_timeout: float = setting(60.0, positive())  # seconds an env server may take to step before it is replaced
    # step the next rollout with the policy before each update while the update trains (Sample Factory's,
    # IMPALA's): each update learns from data one policy old, its ratio taken to the policy that acted
    async_rollouts: bool = setting(False, ANY)
    # learners, each a Ring member with workers / learners of the env servers, its own rollout, and the
    # gradient averaged over all at every minibatch step (DD-PPO); 1: one learner in the run's process
    learners: int = setting(1, at_least(1))
    # DD-PPO's preemption threshold: once this share of the learners has its rollout, the others end theirs
    # (after a quarter of its steps at least); None: every rollout is whole
    preempt_share: float | None = setting(None, optional(between(0, 1, include_low=False).because(
        "a share of the learners; at 0 every rollout would be cut short"), "whole rollouts"))
    # times a run of several learners starts the Ring again from its last checkpoint after a learner died
    ring_restarts: int = setting(3, at_least(0))


# --- advantages ---------------------------------------------------------------

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

def ppo_update(agent: Agent, optimizer, batch: dict, algo, rng: np.random.Generator, peers=SOLO) -> dict:
    """``update_epochs`` passes of minibatch steps on the clipped objective; returns the losses.  With
    several learners (``peers``) each steps on its minibatch of its own batch, and the gradient, the
    advantages' normalisation and the KL are those of all of theirs together."""
    size = batch["obs"].shape[0]
    log_std = agent.actor_logstd if algo.std_never_rises and getattr(agent, "continuous", False) else None
    # capped once per update, not per minibatch step: capping each step would keep every chance fall of the
    # noisy step and drop every rise, and walk the std down to nothing (seen: std 0.6 -> 0.06 in 3.5M steps)
    log_std_before = log_std.detach().clone() if log_std is not None else None
    clipfracs, reported = [], None
    for _epoch in range(algo.update_epochs):
        order = torch.as_tensor(rng.permutation(size), device=batch["obs"].device)
        # as many minibatches as every other learner takes, however short a preempted rollout left this batch
        minibatches = torch.tensor_split(order, algo.num_minibatches)
        if algo.norm_adv:
            moments = peers.moments([batch["advantages"][mb] for mb in minibatches])
        for i, mb in enumerate(minibatches):
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(batch["obs"][mb], batch["actions"][mb])
            logratio = newlogprob - batch["logprobs"][mb]
            ratio = logratio.exp()
            with torch.no_grad():
                old_approx_kl = (-logratio).mean()
                approx_kl = ((ratio - 1) - logratio).mean()  # http://joschu.net/blog/kl-approx.html

            advantages = batch["advantages"][mb]
            if algo.norm_adv:
                mean, std = moments[i]
                advantages = (advantages - mean) / (std + 1e-8)
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
            peers.average_gradients(agent.parameters())
            nn.utils.clip_grad_norm_(agent.parameters(), algo.max_grad_norm)
            optimizer.step()
            # a preempted learner's short batch can leave minibatches empty: it steps with the others on a
            # gradient of nothing, and reports what its last minibatch with rows gave, not an empty one's NaN
            if len(mb):
                clipfracs.append(((ratio.detach() - 1.0).abs() > algo.clip_coef).float().mean().item())
                reported = dict(value_loss=v_loss, policy_loss=pg_loss, entropy=entropy_loss,
                                old_approx_kl=old_approx_kl, approx_kl=approx_kl)
        # every learner joins the mean; one whose minibatches were all empty measured no change: 0
        if algo.target_kl is not None and peers.mean(
                reported["approx_kl"] if reported else torch.zeros(())) > algo.target_kl:
            break
    if log_std is not None:
        with torch.no_grad():
            torch.minimum(log_std, log_std_before, out=log_std)

    y_pred, y_true = batch["values"].cpu().numpy(), batch["returns"].cpu().numpy()
    var_y = np.var(y_true)
    explained_var = None if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)
    return {**{f"losses/{name}": reported[name].item() if reported else None
               for name in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl")},
            "losses/clipfrac": float(np.mean(clipfracs)) if clipfracs else None,
            "losses/explained_variance": explained_var}


# --- training ---------------------------------------------------------------------

def check_settings(cfg) -> None:
    """algo.* as their fields' rules say, then what the settings need together and of the env; raises UsageError."""
    check_fields(cfg.algo, Config, "algo.")
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
    check_learners(cfg)
    if algo.total_timesteps < batch:
        raise UsageError(f"algo.total_timesteps={algo.total_timesteps} is less than one batch ({batch} steps)")
    probe_spaces(env_spec(cfg), fits=lambda observations, actions: make_agent(observations, actions, [1]))


def train(cfg, run, on_iteration=None, make_envs=remote_envs) -> dict:
    """Run PPO as ``cfg`` (the composed app config) says, writing into ``run``
    (a ``fiberrl.run.RunDirectory``).  ``on_iteration(update, envs)`` is called
    after every update.  ``make_envs(cfg, spec, history, generations)`` builds the
    batch of envs (``RemoteEnvs`` by default; benchmarks pass another).  With
    ``algo.learners`` > 1 the learners are Ring members (``on_policy.ring_learners``),
    each running ``learn``, and ``on_iteration`` is given their Ring in place of the envs."""
    check_settings(cfg)
    if cfg.algo.learners > 1:
        return train_on_ring(cfg, run, learn, checkpoint_check(cfg), on_iteration)
    loop = TrainingLoop(run, cfg.algo, num_updates(cfg), until_timesteps=cfg.until_timesteps)
    return learn(cfg, loop, SOLO, on_iteration, make_envs)


def num_updates(cfg) -> int:
    return cfg.algo.total_timesteps // (cfg.workers * cfg.algo.envs_per_worker * cfg.algo.num_steps)


def make_learner(cfg, peers=SOLO, device: torch.device | None = None) -> Learner:
    """The agent as ``cfg.seed`` makes it, with its learner, for ``peers.rank`` of ``peers.size``, on
    ``device`` (by default ``algo.device``'s)."""
    algo = cfg.algo
    if device is None:
        device = torch.device("cuda" if algo.device == "cuda" or (algo.device == "auto" and torch.cuda.is_available())
                              else "cpu")
    observation_space, action_space = probe_spaces(env_spec(cfg))
    torch.manual_seed(cfg.seed)
    agent = make_agent(observation_space, action_space, algo.hidden, algo.log_std_init).to(device)
    peers.broadcast_parameters(agent)
    if peers.rank:  # every learner samples its own actions
        torch.manual_seed(int(np.random.SeedSequence([cfg.seed, 3, peers.rank]).generate_state(1)[0]))
    num_envs = cfg.workers * algo.envs_per_worker // peers.size
    return Learner(agent, algo, num_envs, observation_space.shape, cfg.seed, device, peers)


def checkpoint_check(cfg):
    """What a checkpoint of ``cfg``'s run must hold: ``check(arrays, values)``, raising DamagedFile."""
    # only its shapes are read: on the CPU, leaving the GPUs to the learners
    learner, num_envs = make_learner(cfg, device=torch.device("cpu")), cfg.workers * cfg.algo.envs_per_worker

    def check(arrays: dict, values: dict) -> None:
        checkpoint.check(arrays, values, learner, num_envs)
        checkpoint.check_learners(arrays, values, cfg.algo.learners)
    return check


def learn(cfg, loop, peers, on_iteration=None, make_envs=remote_envs) -> dict:
    """PPO's updates as ``loop`` (a TrainingLoop, or a Ring member's view of one) runs them, as learner
    ``peers.rank`` of ``peers.size``; returns the run's summary."""
    algo = cfg.algo
    spec = env_spec(cfg)
    observation_space, action_space = probe_spaces(spec)
    num_envs = cfg.workers * algo.envs_per_worker // peers.size  # this learner's
    updates = num_updates(cfg)
    learner = make_learner(cfg, peers)
    agent, optimizer, device = learner.agent, learner.optimizer, learner.device

    saved = loop.resume(lambda arrays, values: checkpoint.check(arrays, values, learner, num_envs))
    restored = checkpoint.restore(*saved, learner) if saved is not None else None
    envs = make_envs(cfg, spec, restored and restored.history, restored and restored.generations)
    restarts_before = restored.env_server_restarts if restored else 0
    rollouts, episodic_return = None, None
    try:
        raw_obs = envs.reset()
        if restored and restored.next_obs is not None and not np.array_equal(raw_obs, restored.next_obs):
            log.warning("the envs rebuilt from the checkpoint are not where the run left them (an env that is not "
                        "a function of its seed and actions?); the resumed run goes on from where they are")
        # the uninterrupted run's normaliser had seen these observations before its checkpoint
        cursor = Cursor(raw_obs, learner.observe(raw_obs, update=saved is None))
        rollouts = Rollouts(learner, envs, cursor, observation_space, action_space, algo, num_envs, updates)
        if saved is not None and checkpoint.has_pending(saved[0]):
            checkpoint.restore_pending(rollouts.restore_pending(loop.start), *saved)
        for update in loop:
            t0 = time.perf_counter()
            # set at every update: a resume may give another learning rate than the optimizer's state holds (PBT)
            optimizer.param_groups[0]["lr"] = algo.learning_rate * ((1.0 - update / updates) if algo.anneal_lr
                                                                    else 1.0)
            rollout = rollouts.next(update).collected()
            t_rollout = time.perf_counter() - t0
            loop.timesteps += peers.total(rollout.obs.shape[0] * num_envs)

            with torch.no_grad():
                advantages, returns = gae(rollout.rewards, rollout.values, rollout.ends, rollout.next_value,
                                          algo.gamma, algo.gae_lambda)
            batch = dict(obs=rollout.obs.reshape((-1, *observation_space.shape)),
                         actions=rollout.actions.reshape((-1, *action_space.shape)),
                         logprobs=rollout.logprobs.reshape(-1), advantages=advantages.reshape(-1),
                         returns=returns.reshape(-1), values=rollout.values.reshape(-1))
            losses = ppo_update(agent, optimizer, batch, algo, learner.rng, peers)
            t_update = time.perf_counter() - t0 - t_rollout
            t_wait = rollouts.wait()

            eval_reward = None
            if peers.rank == 0 and algo.eval_every and algo.eval_episodes and ((update + 1) % algo.eval_every == 0
                                                                              or update + 1 == updates):
                policy = Policy(agent, action_space, learner.obs_rms, algo.obs_clip, spec.atari, device,
                                algo.eval_deterministic)
                # a fresh env each time: one that ran episodes before may play a seed otherwise (BipedalWalker keeps
                # its Box2D world), and a resumed run's evaluations must be the uninterrupted run's
                with contextlib.closing(spec.make()) as eval_env:
                    eval_reward = evaluate(eval_env, policy, algo.eval_episodes, update)

            # with several learners, every learner's (their envs numbered in the whole batch)
            episodes = [e._replace(env=rank * num_envs + e.env)
                        for rank, part in enumerate(peers.gather(rollout.episodes)) for e in part]
            restarts = restarts_before + envs.restarts
            returns_ = [e.reward for e in episodes]
            episodic_return = float(np.mean(returns_)) if returns_ else None
            metrics = {"rollout_s": t_rollout, "update_s": t_update, "rollout_wait_s": t_wait,
                       "rollout_collect_s": rollout.seconds, "rollout_inference_s": rollout.inference_s,
                       "charts/SPS": loop.steps_per_second(),
                       "charts/learning_rate": optimizer.param_groups[0]["lr"],
                       "charts/episodic_return": episodic_return,
                       "charts/episodic_length": float(np.mean([e.length for e in episodes])) if episodes else None,
                       "charts/episodes": len(episodes), "charts/env_server_restarts": peers.total(restarts),
                       **losses}
            if loop.end(update, metrics, eval_reward=eval_reward,
                        best=lambda: (checkpoint.policy_arrays(agent, learner.obs_rms),
                                      dict(iteration=update, timesteps=loop.timesteps, eval_reward=eval_reward)),
                        state=lambda: checkpoint.pack(learner, envs, cursor, rollouts.pending(), restarts),
                        on_iteration=on_iteration and (lambda: on_iteration(update, envs))):
                break
    finally:
        if rollouts is not None:
            rollouts.close()
        envs.close()
    return loop.summary(env_server_restarts=peers.total(restarts_before + envs.restarts),
                        episodic_return=episodic_return,
                        agent=agent)


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
    if not checkpoint.holds_agent(arrays):
        raise ValueError("it holds no agent/ parameters: not a PPO policy")
    checkpoint.load_agent(agent, arrays)
    policy = Policy(agent, action_space, checkpoint.load_rms(arrays, "obs_rms"), float(algo.get("obs_clip", 10.0)),
                    spec.atari, torch.device("cpu"), bool(algo.get("eval_deterministic", False)))
    return LoadedPolicy(policy, lambda env, seed, on_step=None: run_episode(env, policy, seed, on_step))


ALGORITHM = Algorithm(
    name="ppo", config=Config, check_settings=check_settings, train=train, load_policy=load_policy,
    worker_modules=("fiberrl.rl.env_servers",),  # what the env servers run (not torch: only the learner needs it)
    resume_may_change=frozenset({"checkpoint_every", "eval_every", "eval_episodes", "eval_deterministic",
                                 "stop_reward", "env_timeout"}),
    app_resume_may_change=RESUME_MAY_CHANGE - {"workers"},  # workers sets the number of envs
    # each is read afresh at every update
    tunable=frozenset({"learning_rate", "ent_coef", "clip_coef", "gae_lambda", "vf_coef", "max_grad_norm",
                       "update_epochs", "target_kl"}),
    mutations={"learning_rate": "tag(log, interval(1e-5, 1e-2))", "ent_coef": "interval(0.0, 0.05)",
               "clip_coef": "interval(0.05, 0.5)", "gae_lambda": "interval(0.8, 1.0)"},
    metrics=frozenset({"rollout_s", "update_s", "rollout_wait_s", "rollout_collect_s", "rollout_inference_s",
                       "charts/SPS", "charts/learning_rate", "charts/episodic_return", "charts/episodic_length",
                       "charts/episodes", "charts/env_server_restarts", "losses/value_loss", "losses/policy_loss",
                       "losses/entropy", "losses/old_approx_kl", "losses/approx_kl", "losses/clipfrac",
                       "losses/explained_variance"}),
    takes_atari=True, has_env_servers=True,
    run_modules=("torch._dynamo",))  # torch's optimizers import it as the first is made: ~1 s of CPU
