"""``tq.init`` configuration: tqstore's own keys and TransferQueue's config, mapped onto them.

TransferQueue users write their config as a mapping or an OmegaConf ``DictConfig`` with
the sections of TransferQueue's packaged ``config.yaml`` (``controller``, ``backend``,
``metrics``).  :func:`translate` turns either form (or a mix) into the keyword arguments
of :class:`~tqstore.store.Store` plus the settings the API layer applies itself
(:class:`CompatSettings`: polling mode, metrics).  TransferQueue keys that have no
meaning for an embedded store (ZMQ addresses, other backends' sections) are accepted and
logged at DEBUG level; see docs/MIGRATING.md for the whole table.

Pure: no I/O, nothing opened.  omegaconf is optional (a ``DictConfig`` is read through its
mapping interface).
"""
from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .errors import ConfigError, TqstoreError

log = logging.getLogger("tqstore")

#: keys of :class:`~tqstore.store.Store` accepted at the top level of ``init``'s config
STORE_KEYS = frozenset({"path", "num_units", "durability", "segment_bytes", "compress", "verify_reads", "result_type",
                        "max_workers", "index_map_bytes", "strict_schema", "total_storage_size"})
#: other top-level tqstore keys
API_KEYS = frozenset({"backend", "sampler", "polling_mode", "get_meta_timeout_s", "ray"})
#: keys of the ``ray`` section (``backend: "ray"``)
RAY_KEYS = frozenset({"name", "nodes"})
#: TransferQueue's top-level sections
TQ_SECTIONS = frozenset({"controller", "backend", "metrics"})

#: TransferQueue storage backends tqstore replaces with its embedded store
_EMBEDDED_BACKENDS = {"SimpleStorage", "embedded"}

#: TransferQueue's sampler class names that live outside tqstore.samplers' registry
_EXTRA_SAMPLERS = {"seqlenbalancedsampler": "tqstore.seqlen_sampler:SeqlenBalancedSampler",
                   "seqlen_balanced": "tqstore.seqlen_sampler:SeqlenBalancedSampler"}


@dataclass
class CompatSettings:
    """What the API layer does on top of the store for TransferQueue-configured users.

    Attributes:
        polling_mode: True (tqstore's behaviour): a ``fetch`` with too few ready rows
            returns an empty BatchMeta at once.  False (TransferQueue's default when its
            ``controller`` section is given): wait up to ``get_meta_timeout_s`` for rows,
            then raise ``WaitTimeoutError`` (a ``TimeoutError`` and a ``RuntimeError``).
        get_meta_timeout_s: TransferQueue's ``TQ_CONTROLLER_GET_METADATA_TIMEOUT`` (1 s by default).
        metrics_enabled, metrics_port: TransferQueue's ``metrics`` section.
        ignored: the TransferQueue keys accepted without effect, dotted.
        backend: ``"embedded"`` (a store in this process) or ``"ray"`` (a store served by a
            named Ray actor that every process of the cluster attaches to).
        ray_name, ray_nodes: the ``ray`` section: the store's name in the cluster (default
            ``"default"``) and the node ids its parts are placed on (default: every alive node).
        backend_named: the config names tqstore's ``backend`` (``"embedded"`` or ``"ray"``);
            when it does not, ``init`` in a Ray task or actor attaches to the cluster's store.
    """

    polling_mode: bool = True
    get_meta_timeout_s: float = 1.0
    metrics_enabled: bool = False
    metrics_port: int = 0
    ignored: List[str] = field(default_factory=list)
    backend: str = "embedded"
    ray_name: str = "default"
    ray_nodes: Optional[List[str]] = None
    backend_named: bool = False


_SETTINGS: "weakref.WeakKeyDictionary[Any, CompatSettings]" = weakref.WeakKeyDictionary()


def settings_for(store: Any) -> CompatSettings:
    """The settings ``init`` recorded for ``store`` (defaults for stores opened otherwise)."""
    try:
        return _SETTINGS.get(store) or CompatSettings()
    except TypeError:  # not weak-referenceable
        return CompatSettings()


def remember(store: Any, settings: CompatSettings) -> None:
    _SETTINGS[store] = settings


def to_plain(cfg: Any) -> Any:
    """A mapping / OmegaConf node as plain dicts and lists; other values (sampler instances) unchanged."""
    if cfg is None or isinstance(cfg, (str, bytes, int, float, bool, type)):
        return cfg
    if isinstance(cfg, Mapping) or (hasattr(cfg, "keys") and hasattr(cfg, "__getitem__") and hasattr(cfg, "items")):
        return {str(k): to_plain(cfg[k]) for k in cfg.keys()}
    if isinstance(cfg, (list, tuple)) or type(cfg).__name__ == "ListConfig":
        return [to_plain(v) for v in cfg]
    return cfg


def _sampler_spec(spec: Any) -> Any:
    """TransferQueue's sampler value (class name, class, instance, or ``{"name": ...,
    **constructor arguments}``) as what make_sampler takes.

    Raises ConfigError: bad constructor arguments of a sampler named here."""
    name = spec.get("name", spec.get("type")) if isinstance(spec, Mapping) else spec
    if isinstance(name, str) and name.lower() in _EXTRA_SAMPLERS:
        import importlib
        mod, _, attr = _EXTRA_SAMPLERS[name.lower()].partition(":")
        cls = getattr(importlib.import_module(mod), attr)
        if not isinstance(spec, Mapping):
            return cls
        kwargs = {k: v for k, v in spec.items() if k not in ("name", "type")}
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise ConfigError(f"bad arguments for sampler {name!r}: {e}") from e
    return spec


#: keys of TransferQueue's config (its config.yaml) that tqstore ignores without a word
_TQ_IGNORED = {"controller.zmq_info", "backend.SimpleStorage.zmq_info"}


def _ignore(settings: CompatSettings, dotted: str, value: Any) -> None:
    settings.ignored.append(dotted)
    if dotted.startswith(("controller.", "backend.SimpleStorage.")) and dotted not in _TQ_IGNORED:
        # (no key of TransferQueue's own config: a typo, say num_data_storage_unit, would go unseen)
        log.warning("tq.init: %s=%r is no TransferQueue config key tqstore knows (a typo?); ignored", dotted, value)
        return
    log.debug("tq.init: TransferQueue key %s=%r does not apply to tqstore; ignored", dotted, value)


def translate(config: Any) -> Tuple[Dict[str, Any], Any, CompatSettings]:
    """Split ``init``'s config into ``(store_kwargs, sampler_spec, settings)``.

    Raises:
        ConfigError: an unknown top-level key, a backend tqstore does not provide, or a
            value of the wrong type.
    """
    try:
        cfg = to_plain(config) or {}
    except TqstoreError:
        raise
    except Exception as e:  # noqa: BLE001 - an OmegaConf node that does not resolve (a missing value, a bad interpolation)
        first = (str(e).splitlines() or [""])[0]
        raise ConfigError(f"the config does not resolve: {type(e).__name__}: {first}") from e
    if not isinstance(cfg, dict):
        raise ConfigError(f"config must be a mapping or an OmegaConf DictConfig, got {type(config).__name__}")
    settings = CompatSettings()
    store: Dict[str, Any] = {}
    sampler: Any = None
    unknown = sorted(set(cfg) - STORE_KEYS - API_KEYS - TQ_SECTIONS)
    if unknown:
        raise ConfigError(f"unknown config keys {unknown}; known: {sorted(STORE_KEYS | API_KEYS | TQ_SECTIONS)}")
    for k in STORE_KEYS & set(cfg):
        store[k] = cfg[k]

    backend = cfg.get("backend", "embedded")
    settings.backend_named = isinstance(cfg.get("backend"), str)
    if isinstance(backend, Mapping):
        _translate_backend(dict(backend), store, settings)
    elif backend == "ray":
        settings.backend = "ray"
    elif backend != "embedded":
        raise ConfigError(f"backend {backend!r} is not available; use 'embedded' or 'ray'")
    _translate_ray(cfg.get("ray"), settings)

    controller = cfg.get("controller")
    if controller is not None:
        if not isinstance(controller, Mapping):
            raise ConfigError(f"controller must be a mapping, got {type(controller).__name__}")
        settings.polling_mode = _flag("controller.polling_mode", controller.get("polling_mode", False))  # TQ's default
        if "sampler" in controller:
            sampler = _sampler_spec(controller["sampler"])
        for k, v in controller.items():
            if k not in ("polling_mode", "sampler"):
                _ignore(settings, f"controller.{k}", v)
    if "sampler" in cfg:
        if sampler is not None:
            raise ConfigError("sampler given twice: as 'sampler' and as 'controller.sampler'")
        sampler = _sampler_spec(cfg["sampler"])
    if "polling_mode" in cfg:
        settings.polling_mode = _flag("polling_mode", cfg["polling_mode"])
    env_timeout = os.environ.get("TQ_CONTROLLER_GET_METADATA_TIMEOUT")
    if "get_meta_timeout_s" in cfg:
        settings.get_meta_timeout_s = _number("get_meta_timeout_s", cfg["get_meta_timeout_s"], float)
    else:
        settings.get_meta_timeout_s = _number("TQ_CONTROLLER_GET_METADATA_TIMEOUT", env_timeout, float) \
            if env_timeout else 1.0

    metrics = cfg.get("metrics")
    if metrics is not None:
        if not isinstance(metrics, Mapping):
            raise ConfigError(f"metrics must be a mapping, got {type(metrics).__name__}")
        settings.metrics_enabled = _flag("metrics.enabled", metrics.get("enabled", False))
        settings.metrics_port = _number("metrics.port", metrics.get("port", 0) or 0, int)
        if settings.metrics_enabled or settings.metrics_port:  # (a TransferQueue user would scrape that port)
            log.info("metrics.enabled/metrics.port: tqstore starts no metrics exporter (port %s is not served); "
                     "its metrics are always collected: tq.get_metrics_endpoint() returns them",
                     settings.metrics_port or "-")
        for k, v in metrics.items():
            if k not in ("enabled", "port"):
                _ignore(settings, f"metrics.{k}", v)
    return store, sampler, settings


def _flag(key: str, value: Any) -> bool:
    """A boolean setting: a bool (or 0/1); the strings "true"/"false" (any case) as such.
    Raises ConfigError for anything else (``bool("false")`` would be True)."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise ConfigError(f"{key} must be true or false, got {value!r}")


def _number(key: str, value: Any, kind: type) -> Any:
    """A numeric setting as ``kind`` (int or float, not negative).  Raises ConfigError naming ``key``."""
    try:
        if isinstance(value, bool):
            raise ValueError
        out = kind(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{key} must be a {'number' if kind is float else 'whole number'}, got {value!r}") from None
    if not out >= 0:
        raise ConfigError(f"{key} must not be negative, got {value!r}")
    return out


def _translate_ray(section: Any, settings: CompatSettings) -> None:
    """The ``ray`` section (``{"name": ..., "nodes": [...]}``), for ``backend: "ray"`` only."""
    if section is None:
        return
    if settings.backend != "ray":
        raise ConfigError("the 'ray' section applies to backend 'ray' only")
    if not isinstance(section, Mapping):
        raise ConfigError(f"ray must be a mapping, got {type(section).__name__}")
    unknown = sorted(set(section) - RAY_KEYS)
    if unknown:
        raise ConfigError(f"unknown keys in the 'ray' section: {unknown}; known: {sorted(RAY_KEYS)}")
    name = section.get("name", "default")
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ConfigError(f"ray.name must be a non-empty str of at most 200 characters, got {name!r}")
    settings.ray_name = name
    nodes = section.get("nodes")
    if nodes is not None:
        if isinstance(nodes, (str, bytes)) or not all(isinstance(n, str) for n in nodes) or not nodes:
            raise ConfigError(f"ray.nodes must be a non-empty list of node ids (str), got {nodes!r}")
        settings.ray_nodes = list(nodes)


def _translate_backend(backend: Dict[str, Any], store: Dict[str, Any], settings: CompatSettings) -> None:
    name = backend.get("storage_backend", "SimpleStorage")
    if not isinstance(name, str) or name not in _EMBEDDED_BACKENDS:  # (a list or dict: no TypeError)
        raise ConfigError(f"backend.storage_backend {name!r} is not available: tqstore replaces TransferQueue's "
                          f"storage backends with its embedded store; use 'SimpleStorage' (see docs/MIGRATING.md)")
    for section, value in backend.items():
        if section == "storage_backend":
            continue
        if section == "SimpleStorage" and isinstance(value, Mapping):
            for k, v in value.items():
                if k == "num_data_storage_units":
                    if v is not None:
                        if "num_units" in store and store["num_units"] != v:
                            raise ConfigError(f"num_units={store['num_units']} contradicts "
                                              f"backend.SimpleStorage.num_data_storage_units={v}")
                        store["num_units"] = v
                elif k == "total_storage_size":
                    if v is not None:
                        if store.get("total_storage_size", v) != v:
                            raise ConfigError(f"total_storage_size={store['total_storage_size']} contradicts "
                                              f"backend.SimpleStorage.total_storage_size={v}")
                        store["total_storage_size"] = v
                else:
                    _ignore(settings, f"backend.SimpleStorage.{k}", v)
        else:
            _ignore(settings, f"backend.{section}", value)


__all__ = ["CompatSettings", "translate", "settings_for", "to_plain", "STORE_KEYS"]
