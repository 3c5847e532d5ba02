"""What a PPO checkpoint holds, under which names: the one place that packs,
checks and unpacks them.

    agent/<param>, obs_rms/*          the policy (also all that best_policy.npz holds)
    optim/<i>/<state>, ret_rms/*, discounted, torch_rng, cuda_rng; values rng, optim_groups
                                      the rest of the learner
    env/<i>/{actions,life_resets,start}, next_obs; values env_episodes, env_generations
                                      each env's actions since its episode began, to replay them
    pending/<tensor>; values pending_episodes, pending_seconds
                                      async rollouts: the rollout collected during the last update
    values env_server_restarts        env servers replaced so far

With several learners (``algo.learners=K``) rank 0 merges their packs into one
checkpoint, which the run's process writes (``merge``): the state they share (network, optimizer, normalisers)
once, each env under its place in the whole batch as above, and each learner's
own random generators (``learner/<k>/torch_rng``, values ``learner_rngs``) and
count of its env servers replaced (values ``learner_restarts``); ``share`` gives
learner k its part back.

The training loop (``fiberrl.training``) adds its own: iteration, timesteps, time_s, best.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fiberrl.rl.env_servers import Episode, SlotHistory
from fiberrl.run import DamagedFile, require

from .learner import Learner, RunningMeanStd
from .rollouts import Cursor, Rollout

ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")  # what torch's Adam keeps per parameter


# --- the policy ---------------------------------------------------------------------

def policy_arrays(agent, obs_rms: RunningMeanStd | None) -> dict:
    """The policy as arrays: the network and the observation normaliser."""
    arrays = {f"agent/{k}": v.detach().cpu().numpy() for k, v in agent.state_dict().items()}
    if obs_rms is not None:
        arrays.update(rms_arrays(obs_rms, "obs_rms"))
    return arrays


def rms_arrays(rms: RunningMeanStd, prefix: str) -> dict:
    return {f"{prefix}/mean": rms.mean, f"{prefix}/var": rms.var, f"{prefix}/count": np.array(rms.count)}


def holds_agent(arrays: dict) -> bool:
    return any(k.startswith("agent/") for k in arrays)


def load_agent(agent, arrays: dict) -> None:
    state = {k[len("agent/"):]: torch.as_tensor(v) for k, v in arrays.items() if k.startswith("agent/")}
    try:
        agent.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(f"the saved network does not fit this env's agent: {str(exc).splitlines()[0]}") from None


def load_rms(arrays: dict, prefix: str) -> RunningMeanStd | None:
    if f"{prefix}/mean" not in arrays:
        return None
    return RunningMeanStd(mean=arrays[f"{prefix}/mean"], var=arrays[f"{prefix}/var"],
                          count=float(arrays[f"{prefix}/count"]))


# --- the whole run ----------------------------------------------------------------------

@dataclass
class Restored:
    """What a checkpoint gives the run beyond the learner's state: where to rebuild the envs from."""
    history: list[SlotHistory] | None   # None: the envs start afresh
    generations: list | None
    next_obs: np.ndarray | None         # where the envs were, to check the rebuilt ones against
    env_server_restarts: int


def pack(learner: Learner, envs, cursor: Cursor, pending: Rollout | None, restarts: int) -> tuple[dict, dict]:
    """(arrays, values) of everything ``restore`` puts back."""
    arrays, values = learner_state(learner)
    env_arrays, env_values = env_state(envs)
    arrays.update(env_arrays, next_obs=cursor.raw)
    values.update(env_values, env_server_restarts=restarts)
    if pending is not None:  # the rollout the next update learns from, collected already
        arrays.update({f"pending/{name}": getattr(pending, name).cpu().numpy() for name in Rollout.TENSORS})
        values.update(pending_episodes=[list(e) for e in pending.episodes],
                      pending_seconds=[pending.seconds, pending.inference_s])
    return arrays, values


def restore(arrays: dict, values: dict, learner: Learner) -> Restored:
    restore_learner(learner, arrays, values)
    history = env_history(arrays, values)
    return Restored(history, values["env_generations"] if history is not None else None,
                    arrays["next_obs"] if history is not None else None, values["env_server_restarts"])


def has_pending(arrays: dict) -> bool:
    return "pending/obs" in arrays


def restore_pending(rollout: Rollout, arrays: dict, values: dict) -> None:
    for name in Rollout.TENSORS:
        getattr(rollout, name).copy_(torch.as_tensor(arrays[f"pending/{name}"]))
    rollout.episodes = [Episode(int(env), float(reward), int(length))
                        for env, reward, length in values["pending_episodes"]]
    rollout.seconds, rollout.inference_s = map(float, values["pending_seconds"])


def check(arrays: dict, values: dict, learner: Learner, num_envs: int) -> None:
    """Raise DamagedFile unless a checkpoint holds all that ``restore`` reads, for ``learner``
    and ``num_envs`` envs (one is only made after an update, so Adam has state for every parameter)."""
    shapes = {f"agent/{k}": tuple(v.shape) for k, v in learner.agent.state_dict().items()}
    shapes["discounted"] = (num_envs,)
    optimizer = [f"optim/{i}/{name}" for i in range(len(learner.optimizer.param_groups[0]["params"]))
                 for name in ADAM_STATE]
    normalisers = [f"{prefix}/{name}" for prefix, rms in (("obs_rms", learner.obs_rms), ("ret_rms", learner.ret_rms))
                   if rms is not None for name in ("mean", "var", "count")]
    require(arrays, values, [*shapes, *optimizer, *normalisers, "torch_rng"],
            ["rng", "optim_groups", "env_server_restarts"])
    wrong = [f"{k} of shape {arrays[k].shape}, not {shape}" for k, shape in shapes.items() if arrays[k].shape != shape]
    if wrong:
        raise DamagedFile(f"it holds {', '.join(wrong)}")
    if any(k.startswith("pending/") for k in arrays):
        require(arrays, values, [f"pending/{name}" for name in Rollout.TENSORS],
                ["pending_episodes", "pending_seconds"])
    episodes = values.get("env_episodes")
    if episodes is not None:
        require(arrays, values, ["next_obs", *(f"env/{i}/{name}" for i in range(len(episodes))
                                               for name in ("actions", "life_resets"))], ["env_generations"])


# --- its parts -----------------------------------------------------------------------------

def learner_state(learner: Learner) -> tuple[dict, dict]:
    arrays = policy_arrays(learner.agent, learner.obs_rms)
    optimizer = learner.optimizer.state_dict()
    arrays.update({f"optim/{index}/{key}": torch.as_tensor(value).cpu().numpy()
                   for index, entry in optimizer["state"].items() for key, value in entry.items()})
    arrays.update(discounted=learner.discounted, torch_rng=torch.get_rng_state().numpy())
    if learner.ret_rms is not None:
        arrays.update(rms_arrays(learner.ret_rms, "ret_rms"))
    if learner.device.type == "cuda":
        arrays["cuda_rng"] = torch.cuda.get_rng_state(learner.device).numpy()
    return arrays, dict(rng=learner.rng.bit_generator.state, optim_groups=optimizer["param_groups"])


def restore_learner(learner: Learner, arrays: dict, values: dict) -> None:
    load_agent(learner.agent, arrays)
    state: dict = {}
    for key, value in arrays.items():
        if key.startswith("optim/"):
            _, index, name = key.split("/", 2)
            state.setdefault(int(index), {})[name] = torch.as_tensor(value)
    learner.optimizer.load_state_dict({"state": state, "param_groups": values["optim_groups"]})
    learner.obs_rms, learner.ret_rms = load_rms(arrays, "obs_rms"), load_rms(arrays, "ret_rms")
    learner.discounted = arrays["discounted"]
    torch.set_rng_state(torch.as_tensor(arrays["torch_rng"]))
    if learner.device.type == "cuda" and "cuda_rng" in arrays:
        torch.cuda.set_rng_state(torch.as_tensor(arrays["cuda_rng"]), learner.device)
    learner.rng.bit_generator.state = values["rng"]


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


# --- several learners -----------------------------------------------------------------------

def merge(parts: list[tuple[dict, dict]]) -> tuple[dict, dict]:
    """One checkpoint of K learners' ``pack``s, in rank order."""
    arrays, values = dict(parts[0][0]), dict(parts[0][1])
    envs = len(arrays["discounted"])  # each learner's
    arrays = {k: v for k, v in arrays.items() if not k.startswith("env/")}
    for rank, (own, _) in enumerate(parts):
        for key, value in own.items():
            if key.startswith("env/"):
                _, index, name = key.split("/", 2)
                arrays[f"env/{rank * envs + int(index)}/{name}"] = value
        for name in ("torch_rng", "cuda_rng"):
            if name in own:
                arrays[f"learner/{rank}/{name}"] = own[name]
    arrays["discounted"] = np.concatenate([own["discounted"] for own, _ in parts])
    if "next_obs" in arrays:
        arrays["next_obs"] = np.concatenate([own["next_obs"] for own, _ in parts])
    if values.get("env_episodes") is not None:
        values["env_episodes"] = [e for _, own in parts for e in own["env_episodes"]]
        values["env_generations"] = [g for _, own in parts for g in own["env_generations"]]
    values["learner_rngs"] = [own["rng"] for _, own in parts]
    values["learner_restarts"] = [own["env_server_restarts"] for _, own in parts]
    values["env_server_restarts"] = sum(values["learner_restarts"])
    return arrays, values


def share(arrays: dict, values: dict, rank: int, learners: int) -> tuple[dict, dict]:
    """Learner ``rank``'s part of a checkpoint of ``learners`` (``merge``'s), as its own ``pack`` was."""
    envs = len(arrays["discounted"]) // learners
    mine = range(rank * envs, (rank + 1) * envs)
    own = {k: v for k, v in arrays.items() if not k.startswith(("env/", "learner/"))}
    for key, value in arrays.items():
        if key.startswith("env/"):
            _, index, name = key.split("/", 2)
            if int(index) in mine:
                own[f"env/{int(index) - mine.start}/{name}"] = value
        elif key.startswith(f"learner/{rank}/"):
            own[key.rsplit("/", 1)[1]] = value
    own["discounted"] = arrays["discounted"][mine.start:mine.stop]
    if "next_obs" in arrays:
        own["next_obs"] = arrays["next_obs"][mine.start:mine.stop]
    values = dict(values, rng=values["learner_rngs"][rank], env_server_restarts=values["learner_restarts"][rank])
    if values.get("env_episodes") is not None:
        servers = len(values["env_generations"]) // learners
        values["env_episodes"] = values["env_episodes"][mine.start:mine.stop]
        values["env_generations"] = values["env_generations"][rank * servers:(rank + 1) * servers]
    return own, values


def check_learners(arrays: dict, values: dict, learners: int) -> None:
    """Raise DamagedFile unless a checkpoint holds what ``share`` reads for ``learners`` learners."""
    require(arrays, values, [f"learner/{k}/torch_rng" for k in range(learners)],
            ["learner_rngs", "learner_restarts"])
    for name in ("learner_rngs", "learner_restarts"):
        if len(values[name]) != learners:
            raise DamagedFile(f"it holds {len(values[name])} {name}, not {learners}")
