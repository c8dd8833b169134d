"""One-line messages for config errors: an unknown key (with the keys it most likely meant
and the keys of its group), a value of the wrong kind, a missing value. nmt.config.to_object
raises them (ConfigError), for the command line and for Python callers alike."""

from __future__ import annotations

import dataclasses
import difflib
import typing

from nmt.errors import ConfigError

if typing.TYPE_CHECKING:  # imported where used: nmt.cli.plain composes without OmegaConf
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException

_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def schema_fields(node: type) -> dict[str, object]:
    """The fields of a schema dataclass and their types, in declaration order."""
    hints = typing.get_type_hints(node)
    return {f.name: hints[f.name] for f in dataclasses.fields(node)}


def schema_keys(schema: type, prefix: str = "") -> list[str]:
    """Every dotted key of a schema, groups included: search, search.beam_size, ..."""
    keys = []
    for name, kind in schema_fields(schema).items():
        keys.append(prefix + name)
        if dataclasses.is_dataclass(kind):
            keys += schema_keys(kind, f"{prefix}{name}.")
    return keys


def schema_node(schema: type, key: str) -> object | None:
    """The type of dotted `key` in the schema ("" is the schema itself); None if no such key."""
    node: object = schema
    for part in filter(None, key.split(".")):
        if not dataclasses.is_dataclass(node) or part not in schema_fields(node):
            return None
        node = schema_fields(node)[part]
    return node


def extra_keys(cfg: DictConfig | dict, schema: type, prefix: str = "") -> list[str]:
    """The dotted keys of `cfg` that `schema` does not have (interpolations left unresolved)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=False)
    fields, extra = schema_fields(schema), []
    for key, value in cfg.items():
        if key not in fields:
            extra.append(f"{prefix}{key}")
        elif dataclasses.is_dataclass(fields[key]) and isinstance(value, dict):
            extra += extra_keys(value, fields[key], f"{prefix}{key}.")
    return extra


def closest_keys(key: str, schema: type) -> list[str]:
    """The schema keys a mistyped `key` most likely meant: the same name in another group
    (max_tokens -> train.max_tokens), else the nearest spelling (search.beam -> beam_size)."""
    keys = [k for k in schema_keys(schema) if not key.startswith(k + ".")]  # not its own group
    leaf = key.rpartition(".")[2]
    same = [k for k in keys if k.rpartition(".")[2] == leaf and k != key]
    if same:
        return same[:3]
    near = difflib.get_close_matches(key, keys, n=1, cutoff=0.7)
    if near:
        return near
    leaves = {k.rpartition(".")[2]: k for k in reversed(keys)}
    return [leaves[m] for m in difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.7)]


def describe_kind(kind: object, key: str) -> str:
    """What a value of schema type `kind` looks like, for an error message."""
    if dataclasses.is_dataclass(kind):
        return f"a group of keys ({key}.{next(iter(schema_fields(kind)))}=... and so on)"
    if typing.get_origin(kind) is list:
        return "a list, e.g. [a,b]"
    return _KINDS.get(kind, getattr(kind, "__name__", str(kind)))


def unknown_key(key: str, schema: type) -> ConfigError:
    """The error for a key the schema lacks: the closest keys, and the keys of its group."""
    group = key.rpartition(".")[0]
    node = schema_node(schema, group)
    near = closest_keys(key, schema)
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    if key.startswith("hydra."):
        return ConfigError(key, f"unknown key{hint} (Hydra's own settings: --hydra-help, "
                                f"--cfg hydra)")
    if not dataclasses.is_dataclass(node):
        return ConfigError(key, f"unknown key{hint}")
    where = f" of {group}" if group else ""
    return ConfigError(key, f"unknown key{hint} (keys{where}: {', '.join(schema_fields(node))})")


def explain(error: OmegaConfBaseException, schema: type) -> ConfigError:
    """The error for an OmegaConf error about `schema`: the key, what was wrong, what is
    allowed."""
    from omegaconf.errors import (
        ConfigAttributeError,
        ConfigKeyError,
        MissingMandatoryValue,
        ValidationError,
    )

    key = error.full_key or "config"
    if isinstance(error, MissingMandatoryValue):
        return ConfigError(key, f"a value is required (add {key}=...)")
    if isinstance(error, ConfigKeyError | ConfigAttributeError) and error.full_key:
        return unknown_key(key, schema)
    kind = schema_node(schema, key) if error.full_key else None
    if isinstance(error, ValidationError) and kind is not None:
        value = error.value if error.value is not None else "this value"
        shown = repr(value) if isinstance(value, str) else str(value)
        return ConfigError(key, f"{shown} is not {describe_kind(kind, key)}")
    return ConfigError(key, (error.msg or str(error)).strip().splitlines()[0])
