"""``Singleton``: a class decorator; calling the decorated class returns its one instance
(created on the first call), as torch_npu's ``ProfilerConfig()``."""

__all__ = []


class Singleton:
    def __init__(self, cls):
        self._cls = cls
        self._instance = {}

    def __call__(self):
        instance = self._instance.get(self._cls)
        if instance is None:
            instance = self._instance[self._cls] = self._cls()
        return instance
