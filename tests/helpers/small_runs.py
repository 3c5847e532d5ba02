"""Settings of runs small enough for a test that trains and resumes them, checkpointed every iteration."""


def small_es(seed: int, noise_size: int) -> list[str]:
    """ES on CartPole; a file's own ``seed`` and ``noise_size`` give it a noise table no other file's runs use."""
    return ["env=cartpole", "algo.population=4", "algo.eval_episodes=1", f"algo.noise_size={noise_size}",
            f"seed={seed}", f"algo.noise_seed={seed}", "workers=1", "tensorboard=false", "algo.checkpoint_every=1"]


# the gymnasium engine: a resume compared with the uninterrupted run must rebuild the envs exactly
SMALL_PPO = ["algo=ppo", "env=cartpole", "env.engine=gymnasium", "tensorboard=false", "algo.eval_every=0", "workers=1",
             "algo.envs_per_worker=1", "algo.num_steps=16", "algo.num_minibatches=2", "algo.update_epochs=1",
             "algo.checkpoint_every=1"]
