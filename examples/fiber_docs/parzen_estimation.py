"""Fiber's Parzen-window (kernel density) estimation with a Pool, run on fiberrl.

Source: Fiber's repository, examples/parzen_estimation.py, github.com/uber/fiber
at ad6faf02b8e94dee498990e9fd9c588234666725 (itself adapted from Sebastian
Raschka's multiprocessing benchmark it names).  It needs only numpy, which is
installed (scikit-learn is not, and is not needed).
Changed besides the import (``from fiber import Pool`` ->
``from fiberrl.runtime import Pool``): the number of 2-D Gaussian samples may
be given as the first command-line argument (Fiber's 10000 is the default), so
that a test can run a smaller one:
``python examples/fiber_docs/parzen_estimation.py [N_SAMPLES]``.
Output: one ``h = <width>, p(x) = <estimate>`` line per window width
(0.1 to 10.2), sorted by width.  As in Fiber's program, the estimate divides
by ``h ** point_x.shape[1]``, which is ``h ** 1`` for its (2, 1) point.
"""
# Adapted from https://sebastianraschka.com/Articles/2014_multiprocessing.html#kernel-density-estimation-as-benchmarking-function # noqa E501
from fiberrl.runtime import Pool
import numpy as np
import sys

N_SAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else 10000


def parzen_estimation(x_samples, point_x, h):
    k_n = 0
    for row in x_samples:
        x_i = (point_x - row[:, np.newaxis]) / (h)
        for row in x_i:
            if np.abs(row) > (1 / 2):
                break
        else:  # "completion-else"*
            k_n += 1
    return (h, (k_n / len(x_samples)) / (h**point_x.shape[1]))


def serial(samples, x, widths):
    return [parzen_estimation(samples, x, w) for w in widths]


def multiprocess(processes, samples, x, widths):
    pool = Pool(processes=processes)
    results = [pool.apply_async(parzen_estimation, args=(samples, x, w))
               for w in widths]
    results = [p.get() for p in results]
    results.sort()  # to sort the results by input window width
    return results


def main():
    np.random.seed(123)

    # Generate random 2D-patterns
    mu_vec = np.array([0, 0])
    cov_mat = np.array([[1, 0], [0, 1]])
    x_2Dgauss = np.random.multivariate_normal(mu_vec, cov_mat, N_SAMPLES)

    widths = np.arange(0.1, 10.3, 0.1)
    point_x = np.array([[0], [0]])
    results = []

    results = multiprocess(4, x_2Dgauss, point_x, widths)

    for r in results:
        print('h = %s, p(x) = %s' % (r[0], r[1]))
    pass


if __name__ == '__main__':
    main()
