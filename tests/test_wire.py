"""What goes over the wire comes back equal: numpy arrays of every layout
(the fast path and numpy's own), and messages sent while one is being pickled."""
import pickle
import sys

import numpy as np
import pytest

from fiberrl.runtime.net import wire

ARRAYS = {
    "float32 vector": np.arange(4, dtype=np.float32),
    "uint8 frames": np.arange(84 * 84 * 4, dtype=np.uint8).reshape(84, 84, 4),
    "0-d": np.array(3.5),
    "empty": np.zeros((0, 3), np.int64),
    "bool": np.array([True, False]),
    "complex": np.array([1 + 2j]),
    "datetime": np.array(["2026-11-21"], dtype="datetime64[ns]"),
    "unicode": np.array(["ab", "c"]),
    "big-endian": np.arange(3, dtype=">i4"),
    "structured": np.zeros(2, dtype=[("x", "f4"), ("n", "i2")]),
    "object": np.array([{"a": 1}, None], dtype=object),
    "strided": np.arange(20).reshape(4, 5)[:, ::2],
    "fortran": np.asfortranarray(np.arange(6).reshape(2, 3)),
    "masked": np.ma.array([1, 2, 3], mask=[0, 1, 0]),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_arrays_round_trip_equal_and_writable(name):
    array = ARRAYS[name]
    back = wire.loads(wire.encode({"array": array, "next": 7}))["array"]
    assert type(back) is type(array)
    assert back.dtype == array.dtype and back.shape == array.shape
    if array.dtype.hasobject:
        assert list(back) == list(array)
    else:
        np.testing.assert_array_equal(back, array)
    if isinstance(array, np.ma.MaskedArray):
        np.testing.assert_array_equal(back.mask, array.mask)
    assert back.flags.writeable


def test_a_read_only_array_comes_back_writable():
    array = np.arange(5.0)
    array.flags.writeable = False
    back = wire.loads(wire.encode(array))
    back[0] = 9.0
    assert back[0] == 9.0 and array[0] == 0.0


class SendsWhilePickled:
    """Pickles a message of its own while being pickled, as a proxy does."""

    def __init__(self, inner):
        self.inner = inner

    def __reduce__(self):
        return SendsWhilePickled, (wire.loads(wire.encode(self.inner)),)


def test_a_message_pickled_while_another_is_gets_its_own_pickler():
    array = np.arange(3)
    back = wire.loads(wire.encode([array, SendsWhilePickled(array * 2), array * 3]))
    np.testing.assert_array_equal(back[0], array)
    np.testing.assert_array_equal(back[1].inner, array * 2)
    np.testing.assert_array_equal(back[2], array * 3)


def test_shared_references_stay_shared():
    array = np.arange(3)
    first, second = wire.loads(wire.encode([array, array]))
    assert first is second
    # and the memo of one message does not leak into the next
    assert wire.loads(wire.encode(array)) is not first
    assert pickle.loads(pickle.dumps(array)) is not array


class Payload:
    """Pickled by reference, by the per-thread pickler."""


def test_the_pickler_keeps_nothing_of_a_message_once_sent():
    import gc
    import weakref

    payload = Payload()
    payload.array = np.zeros(10_000)  # out of band
    alive = weakref.ref(payload)
    wire.dumps(payload)
    del payload
    gc.collect()
    assert alive() is None


def test_a_big_message_leaves_no_big_pickler_behind():
    """The C pickler's memo never shrinks and clearing it costs its largest size: a thread that
    once pickled a big message must not pay for it in every small one after."""
    wire.dumps([(1, 0.0)])
    small = sys.getsizeof(wire._picklers.pickler.pickler)
    wire.dumps([(i, 0.0) for i in range(31_250)])
    assert wire.loads(wire.encode([(i, 0.0) for i in range(3)])) == [(0, 0.0), (1, 0.0), (2, 0.0)]
    assert sys.getsizeof(wire._picklers.pickler.pickler) <= 2 * small
