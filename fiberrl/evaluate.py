"""Run a trained policy from a run directory and report its returns.

    python -m fiberrl.evaluate <run dir> [--episodes 10] [--seed 0]
                               [--checkpoint best|latest|ITERATION] [--video first.gif] [--max-frames N]

Prints one line per episode, then the mean +- std return and the mean length.
Episode i is reset with seed ``seed + i``, so the same arguments give the same
numbers.  ``--checkpoint best`` loads ``best_policy.npz`` (the parameters with
the best eval reward), ``latest`` the newest file in ``checkpoints/``, and a
number the checkpoint of that iteration (a run keeps every one with
``keep_checkpoints=null``), to score the policy as it stood along the way.
``--video`` saves the first episode as an animated GIF; ``--max-frames`` caps
how many of its frames are kept (the episode itself still runs to the end).

From Python: ``load_policy(run_dir, which)`` and ``evaluate(run_dir, episodes, seed, which, video)``.
"""
from __future__ import annotations

import argparse
import os
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import yaml

from .algorithm import ALGORITHMS, LoadedPolicy, algorithm
from .rl.envs import UnknownEnvironment, make_env
from .run import checkpoint_files, load_npz

CHECKPOINT_CHOICES = ("best", "latest")


class RunError(ValueError):
    """The run directory cannot give what was asked; reported as one line."""


def read_config(run_dir: Path) -> dict:
    path = run_dir / "config.yaml"
    if not run_dir.is_dir():
        raise RunError(f"{run_dir}: no such directory")
    if not path.is_file():
        raise RunError(f"{run_dir} is not a run directory (it has no config.yaml)")
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RunError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(config, dict) or not isinstance(config.get("env"), dict) \
            or not isinstance(config.get("algo"), dict):
        raise RunError(f"{path} does not hold a run config (no env and algo sections)")
    return config


def env_config(config: dict) -> dict:
    """What ``make_env`` needs, with the step cap the run trained under."""
    env, algo = config["env"], config["algo"]
    environment = dict(id=env["id"], kwargs=dict(env.get("kwargs") or {}),
                       max_episode_steps=algo.get("episode_steps") or env.get("max_episode_steps"))
    if env.get("atari"):
        environment["atari"] = True
    return environment


def _read_npz(path: Path) -> tuple[dict, dict]:
    try:
        return load_npz(path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise RunError(f"{path} could not be read: {exc}") from None


def _newest_checkpoint(run_dir: Path) -> Path:
    found = checkpoint_files(run_dir / "checkpoints")
    if not found:
        raise RunError(f"{run_dir} has no checkpoints yet (nothing in {run_dir / 'checkpoints'})")
    return list(found.values())[-1]


def _checkpoint_of(run_dir: Path, iteration: int) -> Path:
    found = checkpoint_files(run_dir / "checkpoints")
    if iteration in found:
        return found[iteration]
    held = ", ".join(map(str, found)) or "none"
    raise RunError(f"{run_dir} has no checkpoint of iteration {iteration} (it holds iterations: {held}; a run "
                   f"writes one every algo.checkpoint_every iterations and keeps the last keep_checkpoints of them, "
                   f"every one with keep_checkpoints=null)")


def _policy_file(run_dir: Path, which: str) -> Path:
    if which == "best":
        path = run_dir / "best_policy.npz"
        if not path.is_file():
            hint = "; try --checkpoint latest" if list((run_dir / "checkpoints").glob("*.npz")) else ""
            raise RunError(f"{run_dir} has no best_policy.npz yet (no evaluation has finished){hint}")
        return path
    if which == "latest":
        return _newest_checkpoint(run_dir)
    if str(which).isdigit():
        return _checkpoint_of(run_dir, int(which))
    raise RunError(f"unknown checkpoint {which!r}; choose one of {', '.join(CHECKPOINT_CHOICES)} "
                   f"or an iteration number")


@dataclass
class Loaded:
    environment: dict         # id, kwargs, max_episode_steps (and atari)
    policy: LoadedPolicy
    described: str            # which parameters these are, for the first printed line

    def run_episode(self, env, seed: int, on_step=None) -> tuple[float, int]:
        return self.policy.run_episode(env, seed, on_step)


def _load(run_dir, which: str) -> Loaded:
    """The policy of the run in ``run_dir``, read by its algorithm, which alone knows its files."""
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    name = config["algo"].get("name")
    if name not in ALGORITHMS:
        raise RunError(f"{run_dir / 'config.yaml'}: algo.name={name!r} is none of {', '.join(ALGORITHMS)}")
    record = algorithm(name)
    if record.load_policy is None:
        raise RunError(f"{run_dir}: algo={name} saves no single policy this tool can run")
    path = _policy_file(run_dir, which)
    arrays, values = _read_npz(path)
    try:
        policy = record.load_policy(config, arrays, values)
    except ValueError as exc:
        raise RunError(f"{path}: {exc}") from None
    if which == "best":
        reward = values.get("eval_reward")
        detail = f"eval reward {reward:.2f}" if isinstance(reward, (int, float)) else "eval reward -"
        described = f"best policy (iteration {values.get('iteration', '?')}, {detail})"
    else:
        described = f"checkpoint {path.name} (iteration {values.get('iteration', '?')})"
    environment = env_config(config)
    if policy.episode_steps is not None:
        environment["max_episode_steps"] = policy.episode_steps
    return Loaded(environment, policy, described)


def load_policy(run_dir, which: str = "best"):
    """(env config dict, policy with the saved parameters, obs_mean, obs_std, obs_clip)
    of the run in ``run_dir``; ``which`` is "best", "latest" or an iteration number.  The last three are None for
    a policy that normalises its observations itself (PPO's)."""
    loaded = _load(run_dir, which)
    policy = loaded.policy
    return loaded.environment, policy.policy, policy.obs_mean, policy.obs_std, policy.obs_clip


def save_gif(frames: list, path, fps: float) -> Path:
    from PIL import Image

    path = Path(path)
    images = [Image.fromarray(np.asarray(frame, dtype=np.uint8)) for frame in frames]
    # one shared palette keeps colours steady between frames; GIF delays are in hundredths of a second
    first = images[0].quantize()
    rest = [image.quantize(palette=first) for image in images[1:]]
    first.save(path, save_all=True, append_images=rest, duration=max(20, round(1000 / fps)), loop=0)
    return path


def check_video_path(video) -> Path:
    path = Path(video)
    if path.suffix.lower() != ".gif":
        raise RunError(f"--video {video}: only animated GIFs are written; give a path ending in .gif")
    if not path.parent.is_dir():
        raise RunError(f"--video {video}: the folder {path.parent} does not exist")
    return path


def _record_video(loaded: Loaded, seed: int, path: Path, max_frames: int | None) -> tuple[float, int]:
    # an env of its own: the render mode should not touch the episodes run without video
    environment = loaded.environment
    # frames are drawn off-screen; without this SDL looks for a display and complains on stderr
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    env = make_env(environment["id"], environment["kwargs"], environment["max_episode_steps"],
                   render_mode="rgb_array", atari=environment.get("atari", False))
    frames = []

    def keep_frame():
        if max_frames is None or len(frames) < max_frames:
            frames.append(env.render())
    try:
        total, steps = loaded.run_episode(env, seed, on_step=keep_frame)
        fps = env.metadata.get("render_fps") or 30
    finally:
        env.close()
    save_gif(frames, path, fps)
    return total, steps


def _run_episodes(loaded: Loaded, episodes: int, seed: int, video: Path | None, max_frames: int | None,
                  on_episode=None) -> list[tuple[float, int]]:
    environment = loaded.environment
    env = make_env(environment["id"], environment["kwargs"], environment["max_episode_steps"],
                   atari=environment.get("atari", False))
    results = []
    try:
        for i in range(episodes):
            if i == 0 and video is not None:
                total, steps = _record_video(loaded, seed, video, max_frames)
            else:
                total, steps = loaded.run_episode(env, seed + i)
            results.append((total, steps))
            if on_episode is not None:
                on_episode(i, total, steps)
    finally:
        env.close()
    return results


def evaluate(run_dir, episodes: int = 10, seed: int = 0, which: str = "best", video=None,
             max_frames: int | None = None, on_episode=None) -> list[tuple[float, int]]:
    """[(return, length)] of ``episodes`` episodes of the run's policy, episode i seeded ``seed + i``.
    ``video``: a .gif path for the first episode.  ``on_episode(i, return, length)`` sees each as it ends."""
    if episodes < 1:
        raise RunError(f"episodes={episodes}: evaluate at least one episode")
    video_path = check_video_path(video) if video is not None else None
    return _run_episodes(_load(run_dir, which), episodes, seed, video_path, max_frames, on_episode)


def checkpoint_choice(text: str) -> str:
    if text in CHECKPOINT_CHOICES or text.isdigit():
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: give best, latest or an iteration number")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fiberrl.evaluate",
                                     description="Run a trained policy from a run directory and report its returns.")
    parser.add_argument("run_dir", help="a run directory (holding config.yaml)")
    parser.add_argument("--episodes", type=int, default=10, help="episodes to run (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="episode i is reset with seed+i (default 0)")
    parser.add_argument("--checkpoint", type=checkpoint_choice, default="best",
                        help="best: best_policy.npz; latest: the newest checkpoint; a number: the checkpoint of "
                             "that iteration (default best)")
    parser.add_argument("--video", metavar="PATH.gif", help="save the first episode as an animated GIF")
    parser.add_argument("--max-frames", type=int, metavar="N", help="keep at most N frames in the GIF")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes {args.episodes}: evaluate at least one episode")
    if args.max_frames is not None and args.max_frames < 1:
        parser.error(f"--max-frames {args.max_frames}: keep at least one frame")
    if args.max_frames is not None and args.video is None:
        parser.error("--max-frames only applies with --video")
    return args


def fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv=None) -> None:
    args = parse_args(argv)

    def report(i, total, steps):
        print(f"episode {i + 1:>3}/{args.episodes}  seed {args.seed + i}  return {total:10.2f}  length {steps}",
              flush=True)

    try:
        video = check_video_path(args.video) if args.video is not None else None
        loaded = _load(args.run_dir, args.checkpoint)
        print(f"{args.run_dir}: {loaded.described}", flush=True)
        results = _run_episodes(loaded, args.episodes, args.seed, video, args.max_frames, on_episode=report)
    except (RunError, UnknownEnvironment) as exc:
        fail(str(exc))
    except gym.error.Error as exc:  # e.g. DependencyNotInstalled: rendering this env needs pygame, MuJoCo...
        fail(str(exc).splitlines()[0])
    returns = np.array([r for r, _ in results])
    lengths = np.array([n for _, n in results])
    print(f"mean return {returns.mean():.2f} ± {returns.std():.2f} over {len(results)} episodes, "
          f"mean length {lengths.mean():.1f}")
    if video is not None:
        print(f"video of episode 1: {video}")


if __name__ == "__main__":
    main(sys.argv[1:])
