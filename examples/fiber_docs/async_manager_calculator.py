"""The AsyncManager example of Fiber's API documentation, run on fiberrl.

Source: Fiber's documentation, the "Managers" page (docs/managers, generated
from the AsyncManager docstring in fiber/managers.py), github.com/uber/fiber at
ad6faf02b8e94dee498990e9fd9c588234666725.
Changed besides the import (``from fiber.managers import AsyncManager`` ->
``from fiberrl.runtime.managers import AsyncManager``): the statements that
start and use the manager are under ``if __name__ == '__main__':``.  The
docstring shows them unguarded, which Fiber runs no better than fiberrl: both
start processes with spawn semantics, so the manager's process imports the
main module and would start a manager itself (Fiber's README: "`if __name__ ==
'__main__':` is necessary because Fiber uses *spawn* method").
Expected output: the type of the handle (Fiber's comment names its own class,
fiber.managers.AsyncProxyResult; fiberrl's is fiberrl.runtime.managers.Handle),
then ``42``.
"""
from fiberrl.runtime.managers import AsyncManager

class Calculator():
    def add(self, a, b):
        return a + b

class MyManager(AsyncManager):
    pass

if __name__ == '__main__':
    MyManager.register("Calculator", Calculator)
    manager = MyManager()
    manager.start()

    calc = manager.Calculator()
    res = calc.add(10, 32)
    print(type(res)) # fiber.managers.AsyncProxyResult
    print(res.get()) # 42
