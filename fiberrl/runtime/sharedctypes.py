"""Mirrors ``multiprocessing.sharedctypes``: re-exports :mod:`fiberrl.runtime.primitives.sharedctypes`."""
from .primitives.sharedctypes import Array, RawArray, RawValue, Value, typecode_to_type

__all__ = ["Array", "RawArray", "RawValue", "Value", "typecode_to_type"]
