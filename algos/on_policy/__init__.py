"""What PPO (``algos/ppo.py``) needs around its update: where its envs are and
what steps them (``envs``), the learner's state (``learner``), where each
update's rollout comes from (``rollouts``), what a checkpoint holds of all of
it (``checkpoint``), and how a trained agent acts in evaluation episodes
(``evaluation``).  None of it imports the algorithm: an agent is anything
with ``get_action_and_value`` and ``get_value``, as CleanRL's are."""
