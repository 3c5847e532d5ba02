"""``from fiberrl.managers import AsyncManager`` (the import path Fiber's examples use)."""
from .runtime.managers import *  # noqa: F401,F403
from .runtime.managers import __all__  # noqa: F401
