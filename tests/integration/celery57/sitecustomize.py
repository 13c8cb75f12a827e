"""Declares Celery's control and event queues as Celery 5.7 and its kombu do.

RabbitMQ 4.3 refuses transient non-exclusive queues by default, and Celery 5.7
answered by declaring the mailbox, reply and event queues exclusive
(control_queue_exclusive and event_queue_exclusive, on by default). Debian's
Celery 5.2 declares them transient and shared, so a 4.3-configured node would
refuse the test clients themselves. The RabbitMQ 4 tier puts this folder on
PYTHONPATH: every Python process of the run (pytest, Python workers, celery
inspect, Flower's receiver) then declares what a 5.7 client declares.

The patch is applied when kombu.pidbox or celery.events.receiver is first
imported, so a process that never touches them pays nothing.
"""
import importlib.abc
import importlib.util
import sys

# Debian's own sitecustomize (this file shadows it) only installs apport's hook.
try:
    import apport_python_hook  # noqa: F401
except ImportError:
    pass
else:
    apport_python_hook.install()


def _exclusive(queue):
    queue.exclusive = True
    queue.auto_delete = True
    return queue


def _patch_pidbox(mod):
    mailbox = mod.Mailbox
    get_queue, get_reply_queue = mailbox.get_queue, mailbox.get_reply_queue
    mailbox.get_queue = lambda self, hostname: _exclusive(get_queue(self, hostname))
    mailbox.get_reply_queue = lambda self: _exclusive(get_reply_queue(self))


def _patch_receiver(mod):
    receiver = mod.EventReceiver
    init = receiver.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _exclusive(self.queue)

    receiver.__init__ = __init__


_PATCHES = {"kombu.pidbox": _patch_pidbox, "celery.events.receiver": _patch_receiver}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self.inner, self.patch = inner, patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, patch)
        return spec


sys.meta_path.insert(0, _Finder())
