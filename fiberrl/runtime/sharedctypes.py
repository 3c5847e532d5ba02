"""``multiprocessing.sharedctypes``' names: shared Values and Arrays held by the
run's manager (see ``synchronize`` and ``shared_ctypes``)."""
from multiprocessing.sharedctypes import typecode_to_type

from .synchronize import Array, RawArray, RawValue, Value

__all__ = ["Array", "RawArray", "RawValue", "Value", "typecode_to_type"]
