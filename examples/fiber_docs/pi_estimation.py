"""Fiber's Pi estimation (Pool.map of a sampling function), run on fiberrl.

Source: Fiber's documentation, "Getting Started" > "A more complex example"
(mkdocs/getting-started.md), which is word for word Fiber's repository file
examples/pi_estimation.py, github.com/uber/fiber at
ad6faf02b8e94dee498990e9fd9c588234666725.
Changed besides the import (``from fiber import Pool`` ->
``from fiberrl.runtime import Pool``): NUM_SAMPLES may be given as the first
command-line argument (Fiber's int(1e6) is the default), so that a test can
run a smaller one: ``python examples/fiber_docs/pi_estimation.py [NUM_SAMPLES]``.
Expected output: ``Pi is roughly 3.14...``.
"""
# Adapted from https://spark.apache.org/examples.html
from fiberrl.runtime import Pool
import random
import sys


NUM_SAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else int(1e6)


def is_inside(p):
    x, y = random.random(), random.random()
    return x * x + y * y < 1


def main():
    pool = Pool(processes=4)
    pi = 4.0 * sum(pool.map(is_inside, range(0, NUM_SAMPLES))) / NUM_SAMPLES
    print("Pi is roughly {}".format(pi))


if __name__ == '__main__':
    main()
