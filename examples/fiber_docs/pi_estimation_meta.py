"""Fiber's Pi estimation with resource limits (``@fiber.meta``), run on fiberrl.

Source: Fiber's documentation, "Getting Started" > "Resource Limits"
(mkdocs/getting-started.md), github.com/uber/fiber at
ad6faf02b8e94dee498990e9fd9c588234666725: the Pi estimation program whose
``is_inside`` is decorated with ``@fiber.meta(cpu=1, memory=1000)``
("1 CPU core and 1000M of memory").
Changed besides the imports (``import fiber`` -> ``import fiberrl.runtime as
fiber``, ``from fiber import Pool`` -> ``from fiberrl.runtime import Pool``):
NUM_SAMPLES may be given as the first command-line argument (Fiber's int(1e6)
is the default).
Expected output: ``Pi is roughly 3.14...``.
"""
import fiberrl.runtime as fiber
from fiberrl.runtime import Pool
import random
import sys

NUM_SAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else int(1e6)

# 1 CPU core and 1000M of memory
@fiber.meta(cpu=1, memory=1000)
def is_inside(p):
    x, y = random.random(), random.random()
    return x * x + y * y < 1

def main():
    pool = Pool(processes=4)
    pi = 4.0 * sum(pool.map(is_inside, range(0, NUM_SAMPLES))) / NUM_SAMPLES
    print("Pi is roughly {}".format(pi))

if __name__ == '__main__':
    main()
