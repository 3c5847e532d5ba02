"""fiberrl: population-based and reinforcement learning at cluster scale."""
__version__ = "0.1.0"
