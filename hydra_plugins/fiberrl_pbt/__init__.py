"""``hydra/sweeper=pbt``: Population Based Training of fiberrl's algorithms, its members runs of the
``hydra/launcher=fiberrl`` launcher that go on from exact checkpoint copies, its lineage in ``pbt.jsonl``."""
