"""What a RemoteEnvs steps, for the tests that compare a disturbed run of envs with an undisturbed one."""


def steps_of(envs, actions, on_step=None) -> list:
    """Reset ``envs`` and step them with ``actions``, calling ``on_step(t, envs)`` before step ``t``;
    each step's obs, reward, terminated, truncated, the envs with a final obs and the episodes ended."""
    envs.reset()
    out = []
    for t, a in enumerate(actions):
        if on_step is not None:
            on_step(t, envs)
        step = envs.step(a)
        out.append((step.obs.copy(), step.reward.copy(), step.terminated.copy(), step.truncated.copy(),
                    sorted(step.final_obs), [tuple(e) for e in step.episodes]))
    return out


def same_steps(got: list, want: list) -> None:
    """Assert that two runs of ``steps_of`` stepped alike, naming the first step that differs."""
    import numpy as np
    for t, (a, b) in enumerate(zip(got, want, strict=True)):
        assert all(np.array_equal(x, y) for x, y in zip(a[:4], b[:4])) and a[4:] == b[4:], f"step {t}"
