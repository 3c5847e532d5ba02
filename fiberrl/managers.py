"""Mirrors Fiber's ``fiber.managers`` (``from fiberrl.managers import AsyncManager``): ``runtime.managers``."""
from .runtime.managers import *  # noqa: F401,F403
from .runtime.managers import __all__  # noqa: F401
