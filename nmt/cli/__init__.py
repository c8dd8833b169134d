"""Thin Hydra entry points: each converts its config and calls one plain library function.

`hydra_app(prog, config_name, schema)` makes a console script of `run(config)`: Hydra composes
configs/<config_name>.yaml with the command line (`--cfg job`, `--help` and `-m` work as in
any Hydra app), `to_object` validates the result against `schema`, and every bad key or value,
whether Hydra or nmt finds it, ends in one line on stderr and exit status 1:

    nmt-average: error: lats: unknown key; did you mean last? (keys: output, run_dir, ...)
    nmt-average: error: last: 'abc' is not an integer

A plain command line (key=value overrides of the schema's keys, plain values) is composed
without Hydra and run as Hydra would run it (nmt.cli.plain): the same config and job, without
importing Hydra or OmegaConf (~0.15 s of CPU time). Anything else goes through Hydra.

A command's exit freezes the garbage collector (gc.freeze, registered with atexit): the
interpreter's last collection would walk every object that torch and its compiler stack made
(~0.7 s on 2 CPU cores) only to free memory the process gives back anyway. The commands close
their files and write their checkpoints before they return, not in finalizers. So does its
start, once its config is valid: the modules every run imports (torch; none for
nmt-preprocess) are imported and every object so far frozen, so that the collections during
the command's imports and run skip torch's objects (one full collection of them costs ~0.07 s
of CPU time, a quarter of a one-line nmt-translate's startup beyond torch).
"""

from __future__ import annotations

import atexit
import difflib
import functools
import gc
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from nmt.cli.plain import plain_job, run_job
from nmt.config import register_configs, to_object
from nmt.errors import NmtError

FULL_ERROR = "HYDRA_FULL_ERROR"  # Hydra raises instead of printing its own report when set
CONFIGS = "pkg://nmt.configs"  # configs/, the package nmt.configs (nmt/__init__.py)


def say(line: str) -> None:
    """One line on stderr in one write (stderr writes through: print's text and newline are
    two writes, between which another rank's line can land)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


@contextmanager
def cli_errors(prog: str) -> Iterator[None]:
    """Turn an NmtError into one line on stderr and its exit status (1, or 128 + a signal's
    number for nmt.system.preemption.Preempted), with no traceback."""
    try:
        yield
    except NmtError as e:
        say(f"{prog}: error: {e}")
        sys.exit(e.exit_status)
    except KeyboardInterrupt:
        say(f"{prog}: interrupted")
        sys.exit(130)


def hydra_error(error: Exception, schema: type) -> str | None:
    """One line for an error Hydra raised while composing the config; None if it is not one."""
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    from nmt.config_errors import explain

    cause = error.__cause__
    if isinstance(error, OmegaConfBaseException):
        return str(explain(error, schema))
    if not isinstance(error, HydraException):
        return str(error).strip().splitlines()[0] if raised_in_hydra(error) else None
    if isinstance(cause, OmegaConfBaseException):
        return str(explain(cause, schema))
    if isinstance(error, OverrideParseException):
        why = (error.message.strip().splitlines() or ["bad syntax"])[0]
        return (f"cannot parse {error.override!r}: {why} (the grammar: key=value, "
                "+key=value, key=[a,b], key=a,b with -m)")
    missing = getattr(error, "missing_cfg_file", None) or ""
    if isinstance(error, MissingConfigException) and "submitit" in missing:
        return "hydra/launcher=slurm needs hydra-submitit-launcher: pip install 'nmt[slurm]'"
    if isinstance(error, MissingConfigException) and error.options:
        group, _, name = missing.rpartition("/")
        near = difflib.get_close_matches(name, error.options, n=1)
        hint = f"; did you mean {group}={near[0]}?" if near else ""
        return f"{group}: no config {name!r}{hint} (options: {', '.join(error.options)})"
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip())


def raised_in_hydra(error: Exception) -> bool:
    """True when Hydra itself raised `error` (e.g. its ValueError for --cfg together with -m)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__", "").startswith("hydra.")


def is_plain(args: list[str]) -> bool:
    """A command line of overrides only (no flag such as --help, --cfg or -m), none of them
    setting hydra.mode: a single run."""
    keys = (a.split("=", 1)[0].lstrip("+~") for a in args)
    return not any(a.startswith("-") for a in args) and "hydra.mode" not in keys


def run_plainly(task: Callable, config_name: str, overrides: list[str]) -> None:
    """Run `task` (hydra.main's decorated function) as hydra.main runs a plain command line
    (is_plain), less the composition that hydra.main does first only to read hydra.mode,
    which nmt's configs leave unset: a run's mode is RUN, as hydra.main then sets it."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import (
        create_automatic_config_search_path,
        detect_calling_file_or_module_from_task_function,
        detect_task_name,
    )
    from hydra.core.global_hydra import GlobalHydra

    file, module = detect_calling_file_or_module_from_task_function(task)
    search_path = create_automatic_config_search_path(file, module, CONFIGS)
    hydra = Hydra.create_main_hydra2(task_name=detect_task_name(file, module),
                                     config_search_path=search_path)
    try:
        hydra.run(config_name=config_name, task_function=task,
                  overrides=[*overrides, "hydra.mode=RUN"])
    finally:
        GlobalHydra.instance().clear()


def hydra_app(prog: str, config_name: str, schema: type,
              preload: tuple[str, ...] = ("torch",)) -> Callable:
    """Decorate `run(config: schema)` into a Hydra console script `main()` over
    configs/<config_name>.yaml whose config errors are one line each (see the module doc).
    A plain command line is composed without Hydra (nmt.cli.plain), the same config.
    `preload`: the modules every run of the command imports (frozen once its config is valid,
    see the module doc). `main(cfg)` with a composed DictConfig runs it without reading the
    command line, and freezes nothing."""

    def decorate(run: Callable[[Any], None]) -> Callable[..., None]:
        def command(config) -> None:
            """The console script's run of its valid config: `preload` imported, and every
            object so far frozen, first."""
            for module in preload:
                importlib.import_module(module)
            gc.freeze()
            run(config)

        def task(cfg, start: Callable[[Any], None] = run) -> None:
            with cli_errors(prog):
                start(to_object(cfg, schema))

        def command_task(cfg) -> None:
            task(cfg, command)

        def plain_task(config) -> None:
            with cli_errors(prog):
                command(config)

        # Hydra names the job after it: nmt.cli.train -> train
        command_task.__module__ = run.__module__

        @functools.cache
        def hydra_task() -> Callable:
            """`command_task` as hydra.main's app; Hydra is imported, and the schema stored in its
            ConfigStore (configs/<config_name>.yaml's defaults name it), where first used."""
            import hydra

            register_configs(f"{config_name}_schema")
            return hydra.main(version_base="1.3", config_path=CONFIGS,
                              config_name=config_name)(command_task)

        @functools.wraps(run)
        def main(cfg=None) -> None:
            if cfg is not None:
                return task(cfg)  # a passed config: what hydra.main does with it
            atexit.register(gc.freeze)  # a command: its exit skips the last garbage collection
            if os.environ.get(FULL_ERROR) == "1":
                return hydra_task()()  # the user asked for Hydra's full report
            args = sys.argv[1:]
            os.environ[FULL_ERROR] = "1"  # Hydra raises its composition errors to us
            try:
                job = plain_job(config_name, schema, args)
                if job is not None:
                    run_job(job, plain_task)
                elif is_plain(args):
                    run_plainly(hydra_task(), config_name, args)
                else:
                    hydra_task()()  # --help, --cfg, -m, ...: all of hydra.main
            except Exception as e:
                line = hydra_error(e, schema)
                if line is None:
                    raise  # a bug, not bad input: the full traceback
                say(f"{prog}: error: {line}")
                sys.exit(1)
            finally:
                os.environ.pop(FULL_ERROR, None)

        return main

    return decorate


@contextmanager
def exit_without_teardown() -> Iterator[None]:
    """Under torchrun, end the process when the body ends, with its status (0, or a
    SystemExit's), through os._exit after the atexit handlers and a flush of stdout and stderr:
    without the interpreter's teardown. gloo's worker threads outlive destroy_process_group
    (torch keeps the group, e.g. as default arguments of torch.distributed.nn.functional), and
    the one that ran the last barrier drops it after the barrier returns, with the works it
    waited for: if the interpreter is finalizing by then, releasing their tensors takes the
    GIL, which ends the thread inside a destructor, and std::terminate aborts the process
    (SIGABRT, "terminate called without an active exception", not the command's status).
    Elsewhere (one process; submitit's tasks, which write their result after the command) it
    changes nothing."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        yield
        return
    try:
        yield
        code = 0
    except SystemExit as e:
        code = e.code
    atexit._run_exitfuncs()
    if code is not None and not isinstance(code, int):
        sys.stderr.write(f"{code}\n")  # as the interpreter reports sys.exit("...")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)
