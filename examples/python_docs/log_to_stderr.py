"""The Logging section's example session with log_to_stderr, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Reference" > "Logging" ("Below is an example session with logging turned on").
Changed, besides the import (``import multiprocessing, logging`` ->
``import fiberrl.runtime as multiprocessing, logging``): the docs show an
interactive session; here its five statements, as written, are a program's,
under ``if __name__ == '__main__':`` (as a manager needs).
Expected output, on stderr: ``[WARNING/MainProcess] doomed``; then, as
multiprocessing logs them at INFO, the manager's start and its shutdown.
"""
import fiberrl.runtime as multiprocessing, logging

if __name__ == '__main__':
    logger = multiprocessing.log_to_stderr()
    logger.setLevel(logging.INFO)
    logger.warning('doomed')
    m = multiprocessing.Manager()
    del m
