"""``multiprocessing.sharedctypes``' ``Value``, ``Array``, ``RawValue`` and
``RawArray`` for processes that may run on other hosts: held by this
process's manager of shared objects (:func:`.synchronize.shared_objects_manager`),
each a proxy of it.  ``Value`` and ``Array`` come with a recursive lock of
their own, as in ``multiprocessing`` (``get_lock()``, ``with
v.get_lock(): v.value += 1``).  Numbers are held as an ``array``; ctypes
structures, unions and char arrays are held whole (``managers.held_ctypes``).
"""
from __future__ import annotations

import array
from multiprocessing.sharedctypes import typecode_to_type

from ..managers.held_ctypes import SharedCtypes, array_type, describe, is_compound
from .synchronize import RLock, shared_objects_manager

_TYPECODES = {ctype: code for code, ctype in typecode_to_type.items()}


def _typecode(typecode_or_type) -> str:
    if isinstance(typecode_or_type, str):
        if typecode_or_type not in typecode_to_type:
            raise ValueError(f"unknown typecode {typecode_or_type!r}; use one of {''.join(typecode_to_type)}")
        return typecode_or_type
    try:
        return _TYPECODES[typecode_or_type]
    except KeyError:
        raise TypeError(f"{typecode_or_type!r} is not a ctypes type of a number; shared Values and Arrays hold "
                        f"numbers ({', '.join(sorted(t.__name__ for t in _TYPECODES))})") from None


def _held(ctype, args) -> SharedCtypes:
    return SharedCtypes(shared_objects_manager().HeldCtypes(describe(ctype), args), ctype)


def _holds_numbers(typecode_or_type) -> bool:
    """Whether a Value or Array of this type is plain numbers (an ``array`` typecode); a
    ctypes structure, union or char array is held whole instead (``managers.held_ctypes``)."""
    code = typecode_or_type if isinstance(typecode_or_type, str) else _TYPECODES.get(typecode_or_type)
    return code is None or code != "c"


def RawValue(typecode_or_type, *args):  # noqa: N802
    """A shared number (``.value``) with no lock; or a shared ctypes structure (its fields)."""
    if is_compound(typecode_or_type):
        return _held(typecode_or_type, args)
    code = _typecode(typecode_or_type)
    initial = typecode_to_type[code](*args).value  # as ctypes converts it (0 when not given)
    return shared_objects_manager().Value(code, initial)


def RawArray(typecode_or_type, size_or_initializer):  # noqa: N802
    """A shared array of numbers with no lock; or of chars (``.value``, ``.raw``) or structures."""
    if is_compound(typecode_or_type) or not _holds_numbers(typecode_or_type):
        return _held(*array_type(typecode_or_type, size_or_initializer))
    code = _typecode(typecode_or_type)
    if isinstance(size_or_initializer, int):
        size_or_initializer = [0] * size_or_initializer
    return shared_objects_manager().Array(code, list(array.array(code, size_or_initializer)))


def Value(typecode_or_type, *args, lock=True):  # noqa: N802
    """A shared number, ``.value``, with its lock (``get_lock()``) unless ``lock=False``."""
    raw = RawValue(typecode_or_type, *args)
    if lock is False:
        return raw
    wrapper = SynchronizedCtypes if isinstance(raw, SharedCtypes) else Synchronized
    return wrapper(raw, _lock_of(lock))


def Array(typecode_or_type, size_or_initializer, *, lock=True):  # noqa: N802
    """A shared array of numbers with its lock (``get_lock()``) unless ``lock=False``."""
    raw = RawArray(typecode_or_type, size_or_initializer)
    if lock is False:
        return raw
    if isinstance(raw, SharedCtypes):
        return SynchronizedCtypes(raw, _lock_of(lock))
    return SynchronizedArray(raw, _lock_of(lock), _typecode(typecode_or_type))


def _lock_of(lock):
    """The lock a Value or Array is given, as multiprocessing reads ``lock=``."""
    if lock is True or lock is None:
        return RLock()
    if not hasattr(lock, "acquire"):
        raise AttributeError(f"{lock!r} has no method 'acquire': give lock=True, False, or a Lock()/RLock()")
    return lock


class SynchronizedBase:
    """A shared object and the lock that guards it, as in ``multiprocessing``."""

    def __init__(self, obj, lock):
        self._obj, self._lock = obj, lock

    def get_obj(self):
        return self._obj

    def get_lock(self):
        return self._lock

    def acquire(self, *args):
        return self._lock.acquire(*args)

    def release(self):
        return self._lock.release()

    def __enter__(self):
        return self._lock.__enter__()

    def __exit__(self, *exc):
        return self._lock.__exit__(*exc)

    def __repr__(self):
        return f"<{type(self).__name__} wrapper for {self._obj!r}>"


class Synchronized(SynchronizedBase):
    @property
    def value(self):
        return self._obj.value

    @value.setter
    def value(self, value):
        self._obj.value = value


class SynchronizedArray(SynchronizedBase):
    def __init__(self, obj, lock, typecode: str):
        super().__init__(obj, lock)
        self._typecode = typecode

    def __len__(self):
        return len(self._obj)

    def __getitem__(self, index):
        item = self._obj[index]
        return item.tolist() if isinstance(item, array.array) else item  # a slice is a list, as in multiprocessing

    def __setitem__(self, index, value):
        if isinstance(index, slice):
            value = array.array(self._typecode, value)
        self._obj[index] = value

    def __iter__(self):
        return iter(self[:])


class SynchronizedCtypes(SynchronizedBase):
    """A shared ctypes structure or char array with its lock: fields, items,
    ``.value`` and ``.raw`` read and written through, as multiprocessing's wrappers do."""

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._obj, name)

    def __setattr__(self, name, value):
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._obj, name, value)

    def __len__(self):
        return len(self._obj)

    def __getitem__(self, index):
        return self._obj[index]

    def __setitem__(self, index, value):
        self._obj[index] = value

    def __iter__(self):
        return iter(self._obj)
