"""``PyDynamicMonitorProxySingleton``: the dynolog client (``IPCMonitor.PyDynamicMonitorProxy``
of the msmonitor package), loaded on first use; ``get_proxy()`` is None when the package is
not installed."""
import threading

__all__ = []


class PyDynamicMonitorProxySingleton:
    _instance = None
    _lock = threading.Lock()

    def __new__(cls):
        with cls._lock:
            if cls._instance is None:
                cls._instance = super().__new__(cls)
                cls._instance._proxy = None
                cls._instance._load_success = True
        return cls._instance

    def _load_proxy(self):
        if self._proxy is None and self._load_success:
            try:
                from IPCMonitor import PyDynamicMonitorProxy
            except Exception:  # noqa: BLE001  (not installed, or broken: no dynolog)
                self._load_success = False
                return
            self._proxy = PyDynamicMonitorProxy()

    def get_proxy(self):
        self._load_proxy()
        return self._proxy
