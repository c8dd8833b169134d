"""A plain command line composed without Hydra: the config Hydra would compose, at a fraction of
its startup.

Composing a command line through Hydra costs ~0.15 s of CPU time a process: importing Hydra and
OmegaConf (whose interpolation grammar builds its lexer at import), then Hydra's composition.
`plain_job` builds the schema's dataclass from the command line itself where it can tell that
Hydra would compose the same config, and declines (None) everywhere else, where the command
goes through Hydra as before:

- every argument is KEY=VALUE: KEY a dotted path of names, neither under hydra. nor a config
  group (configs/<group>/), and given once; VALUE of letters, digits and _ . / : @ % + - alone
  (no quotes, lists, commas, interpolations, spaces or escapes), typed as Hydra's override
  grammar types it (`typed`);
- configs/<name>.yaml holds a defaults list only: its command's stored schema, configs of
  Hydra settings alone (configs/common.yaml), `override hydra/job_logging: NAME` or
  `override hydra/hydra_logging: NAME`, and `_self_`; those Hydra settings keep the working
  directory and write nothing (`check_hydra`);
- each value is of its field's type exactly (an integer for a float becomes a float, as in
  OmegaConf). A key the schema lacks, a value of another type, a value left MISSING, a failed
  validation: declined, so that Hydra composes the command line and reports the error as it
  always has.

`run_job` then runs the command as Hydra's run_job runs a job of those settings
(tests/unit/test_cli_plain.py compares both).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nmt.config import MISSING, SCHEMAS
from nmt.config_errors import schema_fields

KEY = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", re.ASCII)
VALUE = re.compile(r"[\w./:@%+-]*", re.ASCII)
# Hydra's override grammar (hydra/grammar/OverrideLexer.g4): a value that is one INT, FLOAT,
# BOOL or NULL token is that type; any other (several tokens, an ID) is its text
_UNSIGNED = r"(?:0|[1-9](?:_?[0-9])*)"
_DIGITS = r"[0-9](?:_?[0-9])*"
_POINT = rf"(?:{_UNSIGNED}\.|{_UNSIGNED}?\.{_DIGITS})"
INT = re.compile(rf"[+-]?{_UNSIGNED}")
FLOAT = re.compile(rf"[+-]?(?:{_POINT}|(?:{_UNSIGNED}|{_POINT})[eE][+-]?{_DIGITS}"
                   r"|[Ii][Nn][Ff]|[Nn][Aa][Nn])")
LOGGING = ("hydra_logging", "job_logging")  # Hydra's logging groups, each "default" unless set
PLAIN_HYDRA = {"run": {"dir": "."}, "output_subdir": None}  # what check_hydra requires


class NotPlain(Exception):
    """Raised inside plain_job where Hydra must compose the command line."""


@dataclasses.dataclass
class PlainJob:
    """A command line composed without Hydra: the validated config, the overrides as given
    and Hydra's logging files (hydra_logging's, then job_logging's) to set up."""

    config: Any
    overrides: list[str]
    logging_files: list[Path]


def typed(text: str) -> Any:
    """The value of an override's plain VALUE as Hydra's override grammar types it: an int
    (1_000, -3; not 007), a float (1e-3, .5, 1., inf, NaN), a bool (true, False), None (null,
    NULL), else the text itself."""
    if INT.fullmatch(text):
        return int(text)
    if FLOAT.fullmatch(text):
        return float(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return None if text.lower() == "null" else text


def plain_overrides(args: list[str], configs: Path) -> dict[str, Any]:
    """The overrides of a plain command line as {key: typed value}; NotPlain otherwise."""
    values: dict[str, Any] = {}
    for arg in args:
        key, eq, value = arg.partition("=")
        top = key.split(".")[0]
        if not (eq and KEY.fullmatch(key) and VALUE.fullmatch(value)) or key in values:
            raise NotPlain(arg)
        if top == "hydra" or (configs / top).is_dir():
            raise NotPlain(arg)  # Hydra's settings, or a config group's choice
        values[key] = typed(value)
    return values


def read_yaml(path: Path) -> tuple[str, Any]:
    """A config file's package ("" if its header names none) and content; NotPlain if it is
    missing or its header holds anything else. Its header, as Hydra reads it: the leading
    `# @KEY VALUE` lines, blank lines skipped."""
    import yaml

    if not path.is_file():
        raise NotPlain(str(path))
    text, package = path.read_text(encoding="utf-8"), ""
    for line in filter(str.strip, text.splitlines()):
        if not re.match(r"\s*#\s*@", line):
            break
        header = re.fullmatch(r"\s*#\s*@package +(\S+)\s*", line)
        if header is None:
            raise NotPlain(line)
        package = header[1]
    return package, yaml.safe_load(text)


def merged(a: dict, b: dict) -> dict:
    """`b` merged into `a`, nested dicts key by key."""
    out = dict(a)
    for key, value in b.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both else value
    return out


def check_hydra(settings: dict) -> None:
    """NotPlain unless Hydra's settings are a job's that run_job reproduces: the working
    directory as the run's folder (nothing made, no chdir), no .hydra/ copy of the config,
    nothing else changed (a sweep's folders alone: a single run uses none)."""
    job = settings.get("job", {})
    if ({k: settings.get(k, "") for k in PLAIN_HYDRA} != PLAIN_HYDRA
            or set(settings) - {*PLAIN_HYDRA, "sweep", "job"} or job not in ({}, {"chdir": False})):
        raise NotPlain("hydra settings")


def hydra_logging_file(group: str, name: object) -> Path:
    """Hydra's own config file hydra/<group>/<name>.yaml, found without importing Hydra;
    NotPlain where Hydra has no such file."""
    spec = importlib.util.find_spec("hydra")
    if spec is None or not spec.submodule_search_locations or not isinstance(name, str):
        raise NotPlain(group)
    path = Path(spec.submodule_search_locations[0]) / "conf" / "hydra" / group / f"{name}.yaml"
    if not path.is_file():
        raise NotPlain(str(path))
    return path


def defaults_list(config_name: str, configs: Path) -> list[Path]:
    """Check configs/<config_name>.yaml's defaults list (see the module doc); Hydra's logging
    files it sets up, in Hydra's order."""
    header, primary = read_yaml(configs / f"{config_name}.yaml")
    if header or not isinstance(primary, dict) or set(primary) != {"defaults"}:
        raise NotPlain(config_name)
    override = {f"override hydra/{group}": group for group in LOGGING}
    logging: dict[str, object] = dict.fromkeys(LOGGING, "default")
    hydra: dict = {}
    for entry in primary["defaults"]:
        if entry in (f"{config_name}_schema", "_self_"):
            continue
        if isinstance(entry, dict) and len(entry) == 1 and set(entry) <= set(override):
            ((key, name),) = entry.items()
            logging[override[key]] = name
        elif isinstance(entry, str) and re.fullmatch(r"\w+", entry):
            package, content = read_yaml(configs / f"{entry}.yaml")
            if package not in ("", "_global_") or not isinstance(content, dict) or (
                    set(content) != {"hydra"} or not isinstance(content["hydra"], dict)):
                raise NotPlain(entry)
            hydra = merged(hydra, content["hydra"])
        else:
            raise NotPlain(str(entry))
    check_hydra(hydra)
    if any((configs / "hydra" / group).exists() for group in LOGGING):
        raise NotPlain("hydra logging")  # nmt's own logging configs, which Hydra might read
    return [hydra_logging_file(group, logging[group]) for group in LOGGING]


def converted(kind: Any, value: Any) -> Any:
    """`value` for a field of type `kind`, as OmegaConf would hold it; NotPlain where it might
    convert it otherwise or refuse it (Hydra then reports the error)."""
    if isinstance(value, str) and value == MISSING:
        raise NotPlain("missing")
    if kind is float and type(value) in (int, float):
        return float(value)
    if kind in (int, bool, str) and type(value) is kind:
        return value
    if kind is Any and type(value) is str:
        return value
    item = getattr(kind, "__args__", (None,))[0]
    if getattr(kind, "__origin__", None) is list and type(value) is list and item in (str, float):
        return [converted(item, v) for v in value]
    raise NotPlain(f"{value!r} for {kind}")


def build(schema: type, values: dict[str, Any], prefix: str = "",
          defaults: object | None = None) -> Any:
    """The dataclass `schema` with the dotted `values` under `prefix` (taken out of `values`),
    every other field its default (of `defaults`, the instance a group field's factory made)."""
    kwargs = {}
    for f, kind in zip(dataclasses.fields(schema), schema_fields(schema).values(), strict=True):
        key = prefix + f.name
        if defaults is not None:
            default = getattr(defaults, f.name)
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = f.default
        if dataclasses.is_dataclass(kind):
            if key in values or not dataclasses.is_dataclass(default):
                raise NotPlain(key)  # a group set to a value, or left MISSING
            kwargs[f.name] = build(kind, values, key + ".", default)
        else:
            kwargs[f.name] = converted(kind, values.pop(key) if key in values else default)
    return schema(**kwargs)


def plain_job(config_name: str, schema: type, args: list[str]) -> PlainJob | None:
    """The command line `args` of configs/<config_name>.yaml composed and validated without
    Hydra, where Hydra would compose the same config (see the module doc); None elsewhere."""
    configs = Path(next(iter(importlib.import_module("nmt.configs").__path__)))
    try:
        values = plain_overrides(args, configs)
        logging_files = defaults_list(config_name, configs)
        if SCHEMAS.get(f"{config_name}_schema") is not schema:
            raise NotPlain(config_name)
        config = build(schema, values)
        if values:
            raise NotPlain(next(iter(values)))  # a key the schema lacks
    except Exception:  # NotPlain, or a value the schema's checks refuse: Hydra reports it
        return None
    return PlainJob(config, list(args), logging_files)


def configure_logging(path: Path) -> None:
    """Set logging up from one of Hydra's logging files, as Hydra's configure_log does (its
    hydra.verbose left false)."""
    import logging.config

    import yaml

    conf = yaml.safe_load(path.read_text(encoding="utf-8"))
    if conf["root"] is not None:
        logging.config.dictConfig(conf)


def flush_loggers() -> None:
    """Flush every logging handler, as Hydra does after a job."""
    import logging

    for ref in logging._handlerList:  # Hydra's _flush_loggers reads it too
        try:
            ref().flush()
        except Exception:  # as Hydra: a handler that fails to flush is left
            continue


def run_job(job: PlainJob, run: Callable[[Any], None]) -> None:
    """Run `run(job.config)` as Hydra's run_job runs a job of the settings plain_job allows:
    logging set up, the job, every handler flushed; a failed job's exception raised after
    Hydra's line naming its overrides."""
    for path in job.logging_files:
        configure_logging(path)
    try:
        run(job.config)
    except Exception as e:
        failed: Exception | None = e
    else:
        failed = None
    flush_loggers()
    if failed is not None:
        sys.stderr.write(f"Error executing job with overrides: {job.overrides}" + os.linesep)
        raise failed
