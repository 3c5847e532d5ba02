"""The Pi estimation of Fiber's README, with ``@fiber.meta(cpu=1)``, run on fiberrl.

Source: Fiber's README.md, "Quick Start" > "Estimating Pi" (also the landing
page of its documentation), github.com/uber/fiber at
ad6faf02b8e94dee498990e9fd9c588234666725.  It differs from
examples/pi_estimation.py in using ``fiber.Pool`` and ``@fiber.meta(cpu=1)``.
Changed besides the import (``import fiber`` -> ``import fiberrl.runtime as
fiber``): NUM_SAMPLES may be given as the first command-line argument (Fiber's
int(1e6) is the default): ``python examples/fiber_docs/readme_pi_estimation.py [NUM_SAMPLES]``.
Expected output: ``Pi is roughly 3.14...``.
"""
import fiberrl.runtime as fiber
import random
import sys

@fiber.meta(cpu=1)
def inside(p):
    x, y = random.random(), random.random()
    return x * x + y * y < 1

def main():
    NUM_SAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else int(1e6)
    pool = fiber.Pool(processes=4)
    count = sum(pool.map(inside, range(0, NUM_SAMPLES)))
    print("Pi is roughly {}".format(4.0 * count / NUM_SAMPLES))

if __name__ == '__main__':
    main()
