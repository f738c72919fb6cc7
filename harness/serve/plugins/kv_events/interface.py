"""Where a request's prompt KV is sent and received, read off vLLM's KV connector interface.

Every vLLM KV connector implements ``KVConnectorBase_V1``; this module wraps the class vLLM's
``KVConnectorFactory.get_connector_class`` hands out (any connector, patched once per class,
before its first instance) at the interface's own methods:

* scheduler, sending side: ``request_finished`` / ``request_finished_all_groups`` returning
  ``delay=True`` (the connector keeps the request's blocks to send them): which blocks, how many
  prompt tokens;
* scheduler, receiving side: ``get_num_new_matched_tokens`` (how many prompt positions arrive,
  after the local prefix-cache hit) and ``update_state_after_alloc`` (the blocks they land in);
* scheduler: ``build_connector_meta`` hands both to the worker as attributes of the step's
  metadata (:data:`SEND_ATTR`, :data:`RECV_ATTR`; pickled with it to a multiprocess worker);
* worker: ``register_kv_caches`` (the model runner's KV caches: :class:`KVView`),
  ``bind_connector_metadata`` (a sent request's blocks, before the step's forward and before any
  notification can free them: event ``sent``), ``get_transfer_results`` / ``get_finished``
  (``finished_recving`` less ``failed_recving``: the request's KV is in place, after the
  connector's own post-processing, before the scheduler runs its first decode step: ``received``).
  A connector that saves and loads inside the step's forward has its module
  announce both (:func:`saved` after the forward, :func:`loaded` before it reads the KV).

Plugins :func:`subscribe` to those events, in an order (faults, which change the KV, before
digests, which read it). What a connector does its own way (its clipped block lists, a host
buffer, a read poll that sees bytes before post-processing and can fail a read: event
``arrived``) comes from the in-server part of its package (``harness/connectors/<name>/in_server``,
a module or a package of modules; :func:`specifics_for`). Never raises into vLLM: a failing hook
logs and the connector's own result is returned.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import logging
import pkgutil
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from harness import connectors
from harness.serve.plugins import compat
from harness.serve.plugins.kv_events.view import KVView, build_view

logger = logging.getLogger("vllm.pd_accuracy.kv_events")

FACTORY_MODULE = "vllm.distributed.kv_transfer.kv_connector.factory"
IN_SERVER = "in_server"     # the module (or package) of a connector package that runs here
# plain tuples on the metadata: it is pickled to a multiprocess worker
SEND_ATTR = "pd_accuracy_send"    # {req_id: (block ids per group, num_tokens)}
RECV_ATTR = "pd_accuracy_recv"    # {req_id: (remote request id, block ids, first position, count)}
# a connector that saves a prompt's KV during the step's forward (its in_server): the requests
# it saves this step, announced once the forward wrote them (``saved``)
SAVE_ATTR = "pd_accuracy_save"    # {req_id: (block ids per group, num_tokens)}
EVENTS = ("registered", "sent", "arrived", "received")
_MARK = "__pd_accuracy_kv_events__"
_STATE = "_pd_accuracy_kv_events"
_listeners: dict[str, list[tuple[int, Callable]]] = {event: [] for event in EVENTS}
# plugins that change what a connector class answers (a weather fault), not only watch it
_class_patchers: list[Callable[[type], None]] = []
_installed = False
_lock = threading.Lock()


@dataclass(frozen=True)
class Sent:
    """A request whose prompt KV the connector keeps to send: scheduler (logical) block ids
    per transfer group, holding prompt positions ``0 .. num_tokens - 1``."""

    request_id: str
    block_ids: tuple[tuple[int, ...], ...]
    num_tokens: int


@dataclass
class Received:
    """A request whose prompt KV arrives: positions ``token_offset .. token_offset + num_tokens
    - 1`` in logical ``block_ids`` per transfer group. ``notes``: what listeners kept at arrival
    (before the connector's post-processing), for their ``received`` call."""

    request_id: str
    remote_request_id: str | None
    block_ids: tuple[tuple[int, ...], ...]
    token_offset: int
    num_tokens: int
    notes: dict = field(default_factory=dict)


def subscribe(event: str, callback: Callable, order: int = 50) -> None:
    """Call ``callback`` on ``event`` (lower ``order`` first; once per callback):
    ``registered(connector, view)``, ``sent(connector, view, Sent)``,
    ``arrived(connector, view, Received, fail)`` (``fail()`` reports the read as failed; only
    where the connector's module gives that moment), ``received(connector, view, Received)``."""
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}: expected one of {EVENTS}")
    with _lock:
        if all(existing is not callback for _, existing in _listeners[event]):
            _listeners[event].append((order, callback))
            _listeners[event].sort(key=lambda item: item[0])


def patch_classes_with(patcher: Callable[[type], None]) -> None:
    """Call ``patcher(cls)`` on every connector class the factory hands out, after the
    interface's own wrapping (idempotence is the patcher's)."""
    with _lock:
        if patcher not in _class_patchers:
            _class_patchers.append(patcher)


def _dispatch(event: str, *args: Any) -> None:
    for _, callback in list(_listeners[event]):
        try:
            callback(*args)
        except Exception:  # noqa: BLE001 - one listener never stops another, nor vLLM
            logger.exception("pd-accuracy kv-events: %s listener %r failed", event, callback)


def in_server_modules(package: ModuleType) -> tuple[ModuleType, ...]:
    """A connector package's in-server modules: its ``in_server`` module, or each module of its
    ``in_server`` package; none where it has neither."""
    name = f"{package.__name__}.{IN_SERVER}"
    if importlib.util.find_spec(name) is None:
        return ()
    found = importlib.import_module(name)
    if not hasattr(found, "__path__"):
        return (found,)
    return tuple(importlib.import_module(f"{name}.{info.name}")
                 for info in pkgutil.iter_modules(found.__path__))


@functools.lru_cache(maxsize=None)
def _in_server_of(packages: tuple[ModuleType, ...]) -> tuple[ModuleType, ...]:
    return tuple(module for package in packages for module in in_server_modules(package))


def _specific_modules() -> tuple[ModuleType, ...]:
    """Every connector package's in-server modules (a package registered later is found too)."""
    return _in_server_of(connectors.packages())


def specifics_for(cls: type) -> ModuleType | None:
    """The module that knows what connector class ``cls`` does its own way (by the names along
    its MRO, so a subclass finds its parent's), or None: the interface alone serves it."""
    for klass in cls.__mro__:
        for module in _specific_modules():
            if klass.__name__ in getattr(module, "CONNECTOR_CLASSES", ()):
                return module
    return None


def per_server_env() -> tuple[str, ...]:
    """The vLLM variables each connector module says the harness sets per server (ports)."""
    return tuple(name for module in _specific_modules()
                 for name in getattr(module, "PER_SERVER_ENV", ()))


def state(connector: Any) -> dict:
    """This connector instance's bookkeeping (pending sends / receives, plans, view)."""
    found = connector.__dict__.get(_STATE)
    if found is None:
        found = connector.__dict__[_STATE] = {"send": {}, "recv": {}, "plans": {}, "view": None}
    return found


def _specific(connector: Any, name: str) -> Callable | None:
    module = specifics_for(type(connector))
    return getattr(module, name, None) if module is not None else None


def _wrap(cls: type, method: str, make: Callable[[Callable], Callable]) -> None:
    original = cls.__dict__.get(method) or getattr(cls, method, None)
    if original is None or getattr(original, _MARK, False):
        return
    wrapped = functools.wraps(original)(make(original))
    setattr(wrapped, _MARK, True)
    setattr(cls, method, wrapped)


def _guarded(hook: Callable) -> Callable:
    """Run ``hook(self, result, *args)`` after the original; log, never raise."""
    def make(original: Callable) -> Callable:
        def method(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            try:
                hook(self, result, *args, **kwargs)
            except Exception:  # noqa: BLE001
                logger.exception("pd-accuracy kv-events: %s hook failed", original.__name__)
            return result
        return method
    return make


# -- scheduler side -------------------------------------------------------------------------

def _on_finished(self, result, request, block_ids, *args, **kwargs) -> None:
    delay, params = result
    if not delay:
        return
    sent_blocks = _specific(self, "sent_blocks")
    found = sent_blocks(self, request, block_ids, params) if sent_blocks else (
        block_ids, request.num_computed_tokens)
    if found is None:
        return
    blocks, num_tokens = found
    state(self)["send"][request.request_id] = Sent(request.request_id, _groups(blocks),
                                                   int(num_tokens))


def _on_matched(self, result, request, num_computed_tokens, *args, **kwargs) -> None:
    count = result[0]
    if count:
        params = getattr(request, "kv_transfer_params", None) or {}
        state(self)["recv"][request.request_id] = [params.get("remote_request_id"), (),
                                                   int(num_computed_tokens), int(count)]


def _on_alloc(self, result, request, blocks, num_external_tokens, *args, **kwargs) -> None:
    pending = state(self)["recv"].get(request.request_id)
    if pending is not None and num_external_tokens > 0:
        own = _specific(self, "receiving_blocks")
        unhashed = getattr(blocks, "get_unhashed_block_ids_all_groups", None)
        pending[1] = _groups(own(self, blocks, pending[2]) if own else
                             unhashed() if unhashed else blocks.get_block_ids())


def _on_build(self, meta, scheduler_output, *args, **kwargs) -> None:
    own = state(self)
    setattr(meta, SEND_ATTR, {r: (sent.block_ids, sent.num_tokens)
                              for r, sent in own["send"].items()})
    own["send"].clear()
    receiving = _specific(self, "receiving")
    wanted = set(receiving(meta)) if receiving else {
        r for r, pending in own["recv"].items() if pending[1]}
    setattr(meta, RECV_ATTR, {r: tuple(own["recv"].pop(r)) for r in list(own["recv"])
                              if r in wanted})
    stores = _specific(self, "stores")
    if stores:
        setattr(meta, SAVE_ATTR, {r: (_groups(blocks), int(num_tokens)) for r, (blocks, num_tokens)
                                  in stores(self, meta, scheduler_output).items()})


# -- worker side ----------------------------------------------------------------------------

def _on_register(self, result, kv_caches, *args, **kwargs) -> None:
    own = state(self)
    view = build_view(self, kv_caches)
    moved = _specific(self, "moved_buffers")
    own["view"] = dataclasses.replace(view, moved=moved(self)) if moved else view
    link = _specific(self, "link_worker")
    if link:
        link(self)
    _dispatch("registered", self, own["view"])


def _on_bind(self, result, metadata, *args, **kwargs) -> None:
    own = state(self)
    view = own["view"]
    sends = getattr(metadata, SEND_ATTR, None) or {}
    for request_id, (block_ids, num_tokens) in sends.items():
        _dispatch("sent", self, view, Sent(request_id, block_ids, num_tokens))
    recv = getattr(metadata, RECV_ATTR, None) or {}
    receiving = _specific(self, "receiving")
    theirs = receiving(metadata) if receiving else {}
    for request_id, (remote_id, block_ids, offset, count) in recv.items():
        remote_id, block_ids = theirs.get(request_id, (remote_id, block_ids))
        own["plans"][request_id] = Received(request_id, remote_id, _groups(block_ids),
                                            offset, count)


def arrived(connector: Any, done: Any, failed: set, fail: Callable[[str], None]) -> None:
    """What a connector's module calls when its read poll reports reads ``done`` (before its
    post-processing); ``fail(request_id)`` reports one as failed the connector's way."""
    own = state(connector)
    for request_id in sorted((set(done or ()) - set(failed)) & own["plans"].keys()):
        _dispatch("arrived", connector, own["view"], own["plans"][request_id],
                  functools.partial(fail, request_id))


def saved(connector: Any, metadata: Any) -> None:
    """What a connector's module calls once the step's forward wrote the KV its connector saves
    in that step (``SAVE_ATTR``): event ``sent`` per request, the KV still in its blocks."""
    view = state(connector)["view"]
    for request_id, (block_ids, num_tokens) in (getattr(metadata, SAVE_ATTR, None) or {}).items():
        _dispatch("sent", connector, view, Sent(request_id, block_ids, num_tokens))


def loaded(connector: Any, metadata: Any) -> None:
    """What a connector's module calls once it loaded this step's KV synchronously, before the
    forward reads it: event ``received`` for each request the step's metadata receives."""
    own = state(connector)
    for request_id in sorted(set(getattr(metadata, RECV_ATTR, None) or {}) & own["plans"].keys()):
        _dispatch("received", connector, own["view"], own["plans"].pop(request_id))


def received_request_ids(results: Any) -> set[str]:
    """Requests whose KV arrived intact, from either completion API's return value."""
    if hasattr(results, "finished_recving"):
        return set(results.finished_recving) - set(getattr(results, "failed_recving", ()) or ())
    _done_sending, done_recving = results
    return set(done_recving or ())


def _completion(original: Callable) -> Callable:
    def completed(self, *args, **kwargs):
        own = state(self)
        if own.get("completing"):       # the base class's get_transfer_results calls get_finished
            return original(self, *args, **kwargs)
        own["completing"] = True
        try:
            result = original(self, *args, **kwargs)
        finally:
            own["completing"] = False
        try:
            plans = own["plans"]
            for request_id in sorted(received_request_ids(result) & plans.keys()):
                _dispatch("received", self, own["view"], plans.pop(request_id))
            for request_id in set(getattr(result, "failed_recving", ()) or ()) & plans.keys():
                plans.pop(request_id)
        except Exception:  # noqa: BLE001
            logger.exception("pd-accuracy kv-events: completion hook failed")
        return result
    return completed


def patch_connector_class(cls: type) -> None:
    """Wrap ``cls`` (a ``KVConnectorBase_V1`` subclass) at the interface; idempotent. A class
    whose module says why not (``UNHOOKED``: a wrapper, a connector that moves no KV between
    servers) is left alone."""
    if getattr(specifics_for(cls), "UNHOOKED", None):
        return
    _wrap(cls, "request_finished", _guarded(_on_finished))
    _wrap(cls, "request_finished_all_groups", _guarded(_on_finished))
    _wrap(cls, "get_num_new_matched_tokens", _guarded(_on_matched))
    _wrap(cls, "update_state_after_alloc", _guarded(_on_alloc))
    _wrap(cls, "build_connector_meta", _guarded(_on_build))
    _wrap(cls, "register_kv_caches", _guarded(_on_register))
    _wrap(cls, "bind_connector_metadata", _guarded(_on_bind))
    _wrap(cls, "get_transfer_results", _completion)
    _wrap(cls, "get_finished", _completion)
    install = _specific_install(cls)
    if install:
        install(cls)
    module = specifics_for(cls)
    extend = getattr(module, "extend", None) if module is not None else None
    if extend:    # what the class lacks that the evidence needs (its own counters)
        extend(cls)
    for patcher in list(_class_patchers):
        try:
            patcher(cls)
        except Exception:  # noqa: BLE001
            logger.exception("pd-accuracy kv-events: class patcher %r failed", patcher)


def hold_leases(cut: Callable[[Any, dict, float], None]) -> bool:
    """Let ``cut(worker, leases, now)`` shorten a prefill's send leases (request id -> the
    deadline of its blocks) before each step's lease check, on every connector whose module
    gives that moment (``hold_leases``); True when one did."""
    hooked = False
    for module in _specific_modules():
        install_hook = getattr(module, "hold_leases", None)
        if install_hook is not None:
            hooked = bool(install_hook(cut)) or hooked
    return hooked


def gives_arrival(connector: Any) -> bool:
    """Whether this connector's module gives the ``arrived`` event (its read poll; a module
    whose ``install`` hooks other moments says ``GIVES_ARRIVAL = False``)."""
    module = specifics_for(type(connector))
    return (_specific_install(type(connector)) is not None
            and getattr(module, "GIVES_ARRIVAL", True))


def _specific_install(cls: type) -> Callable | None:
    module = specifics_for(cls)
    return getattr(module, "install", None) if module is not None else None


def _groups(block_ids: Any) -> tuple[tuple[int, ...], ...]:
    groups = list(block_ids or ())
    if groups and not isinstance(groups[0], (list, tuple)):
        groups = [groups]
    return tuple(tuple(int(b) for b in group) for group in groups)


def _patch_factory(module: Any) -> None:
    if not compat.attach("kv-events"):
        return      # this vLLM lacks a method the events wrap: its connectors stay as built
    factory = module.KVConnectorFactory
    original = factory.get_connector_class
    if getattr(original, _MARK, False):
        return

    def get_connector_class(cls, *args, **kwargs):
        connector_cls = original.__func__(cls, *args, **kwargs)
        try:
            patch_connector_class(connector_cls)
        except Exception:  # noqa: BLE001
            logger.exception("pd-accuracy kv-events: patching %s failed", connector_cls)
        return connector_cls

    setattr(get_connector_class, _MARK, True)
    factory.get_connector_class = classmethod(get_connector_class)


def install() -> None:
    """Patch every connector class vLLM's factory hands out (a post-import hook on the
    factory module); idempotent, never raises."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    try:
        import wrapt

        wrapt.register_post_import_hook(_patch_factory, FACTORY_MODULE)
    except Exception:  # noqa: BLE001
        logger.exception("pd-accuracy kv-events: install failed")
