"""Fiber's line count (Pool.map of a per-file line count over files), run on fiberrl.

Source: Fiber's repository, examples/line_count.py, github.com/uber/fiber at
ad6faf02b8e94dee498990e9fd9c588234666725.
Changed besides the import (``import fiber`` -> ``import fiberrl.runtime as
fiber``): Fiber's program counts the lines of the ``*.py`` files in the
current directory; here the directory may be given as the first command-line
argument (``.`` as in Fiber when none is), so that a test can point it at a
small directory of generated files instead of depending on where it is run:
``python examples/fiber_docs/line_count.py [DIR]``.
Output: one ``<file>\\t<line count>`` line per file, sorted by name.
"""
import fiberrl.runtime as fiber
import sys
from pathlib import Path


def line_count(fname):
    with open(fname) as f:
        return len(f.readlines())


def main():
    files = sorted(Path(sys.argv[1] if len(sys.argv) > 1 else '.').glob('*.py'))
    pool = fiber.Pool(4)
    counts = pool.map(line_count, files)
    for f, c in zip(files, counts):
        print("{}\t{}".format(f, c))


if __name__ == '__main__':
    main()
