"""Fiber's first example, run on fiberrl.

Source: Fiber's documentation, "Getting Started" > "A minimal example"
(mkdocs/getting-started.md; also README.md "Quick Start" > "Hello Fiber"),
github.com/uber/fiber at ad6faf02b8e94dee498990e9fd9c588234666725.
Changed: only the import (``import fiber`` -> ``import fiberrl.runtime as fiber``).
Expected output: ``Hello, Fiber!`` (the process is never joined: as with
multiprocessing, the main process waits for its non-daemonic children at exit).
"""
import fiberrl.runtime as fiber

if __name__ == '__main__':
    fiber.Process(target=print, args=('Hello, Fiber!',)).start()
