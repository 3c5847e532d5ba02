"""The RL pieces the algorithms are made of: environments (``envs``, the
Atari preprocessing in ``atari``, POET's terrains in ``walker_terrain``),
flat-parameter policies (``policies``), the shared noise table (``noise``),
PPO's remote env servers (``env_servers``) and POET's plots
(``terrain_plot``)."""
