"""Shared ctypes objects that are not plain numbers, held by a manager:
``Array('c', b'...')`` (``.value``, ``.raw``), ``Value(SomeStructure, ...)``
and arrays of structures, as ``multiprocessing.sharedctypes`` makes them.

multiprocessing puts them in shared memory; processes here may be on other
hosts, so the object lives in the run's manager (:class:`HeldCtypes`, reached
through :class:`HeldCtypesProxy`) and this side (:class:`SharedCtypes`) walks
it by a path of indexes and field names: ``points[2].x = 1.5`` is one call
that sets field ``x`` of element 2 where the object lives.  Indexing or
reading a field of structure or array type gives another view (so ``for p in
points: p.x *= 2`` changes the shared points, as in multiprocessing); reading
a simple field or element gives its value.
"""
from __future__ import annotations

import ctypes
from multiprocessing.sharedctypes import typecode_to_type

from .proxy import BaseProxy, forwarding

_COMPOUND = (ctypes.Structure, ctypes.Union, ctypes.Array)


def is_compound(ctype) -> bool:
    return isinstance(ctype, type) and issubclass(ctype, _COMPOUND)


def array_type(typecode_or_type, size_or_initializer):
    """The ctypes array type and its initial items, as multiprocessing's RawArray takes them."""
    element = typecode_to_type.get(typecode_or_type, typecode_or_type)
    if isinstance(size_or_initializer, int):
        return element * size_or_initializer, ()
    items = tuple(size_or_initializer)
    return element * len(items), items


def describe(ctype):
    """``ctype`` as it can be pickled: an array type is made on the fly (``c_char * 11``),
    so it travels as its element's description and its length."""
    if isinstance(ctype, type) and issubclass(ctype, ctypes.Array):
        return ("array", describe(ctype._type_), ctype._length_)
    return ctype


def build(description):
    if isinstance(description, tuple):
        _, element, length = description
        return build(element) * length
    return description


def _field_type(ctype, name: str):
    for field in getattr(ctype, "_fields_", ()):
        if field[0] == name:
            return field[1]
    return None


class HeldCtypes:
    """In the manager: the ctypes object, reached by paths of steps (an index, a
    slice or a field name), each step as Python's own ``obj[step]`` or
    ``getattr(obj, step)`` takes it, so what a step returns shares the object's memory."""

    def __init__(self, description, args):
        self._obj = build(description)(*args)

    def _walk(self, path) -> object:
        obj = self._obj
        for step in path:
            obj = getattr(obj, step) if isinstance(step, str) else obj[step]
        return obj

    def get(self, path):
        return self._walk(path)

    def set(self, path, value) -> None:
        *to, last = path
        parent = self._walk(to)
        if isinstance(last, str):
            setattr(parent, last, value)
        else:
            parent[last] = value

    def __repr__(self):
        return f"<{type(self._obj).__name__} held for sharing>"


@forwarding("get", "set", also=("__repr__",))
class HeldCtypesProxy(BaseProxy):
    pass


class SharedCtypes:
    """This side of a shared ctypes object, or of a part of it: reads and writes
    go to the object the manager holds."""

    __slots__ = ("_held", "_ctype", "_path")

    def __init__(self, held: HeldCtypesProxy, ctype, path: tuple = ()):
        object.__setattr__(self, "_held", held)
        object.__setattr__(self, "_ctype", ctype)
        object.__setattr__(self, "_path", path)

    def _step(self, step, ctype):
        # as ctypes reads it: a field that is a char array reads as its bytes (str for wchar)
        text_field = isinstance(step, str) and getattr(ctype, "_type_", None) in (ctypes.c_char, ctypes.c_wchar)
        if is_compound(ctype) and not text_field:
            return SharedCtypes(self._held, ctype, self._path + (step,))
        return self._held.get(self._path + (step,))

    def _index(self, index: int) -> int:
        length = len(self)
        if index < 0:
            index += length
        if not 0 <= index < length:
            raise IndexError("invalid index")
        return index

    def __len__(self):
        try:
            return self._ctype._length_
        except AttributeError:
            raise TypeError(f"object of type {self._ctype.__name__!r} has no len()") from None

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._held.get(self._path + (index,))  # a copy, as ctypes gives one
        return self._step(self._index(index), self._ctype._type_)

    def __setitem__(self, index, value):
        if not isinstance(index, slice):
            index = self._index(index)
        self._held.set(self._path + (index,), value)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._step(name, _field_type(self._ctype, name))

    def __setattr__(self, name: str, value) -> None:
        self._held.set(self._path + (name,), value)

    def get_copy(self):
        """The whole object (or part) as a local ctypes object, in one call."""
        return self._held.get(self._path)

    def __reduce__(self):
        return _rebuild, (self._held, describe(self._ctype), self._path)

    def __repr__(self):
        where = "".join(f"[{s}]" if not isinstance(s, str) else f".{s}" for s in self._path)
        return f"<shared {self._ctype.__name__}{' at ' + where if where else ''}>"


def _rebuild(held, description, path):
    return SharedCtypes(held, build(description), path)
