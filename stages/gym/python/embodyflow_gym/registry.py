"""Where the worker finds adapters: Python's plugin mechanism, entry points.

A package registers an adapter with one line of its `pyproject.toml`:

    [project.entry-points."embodyflow_gym.adapters"]
    cartpole = "mylab.adapters:cartpole"

and a task names it (`gym.adapter = "cartpole"`) once the package is
installed in the workers' Python (`pip install -e .`). The object named is
an adapter's `make` function (or a module defining `make`); `PACKAGES` is
read from its module. A one-off needs no package: a task's adapter
"module:function" (e.g. `myenvs:make`, with `myenvs` importable: on
PYTHONPATH or installed) is imported as it is named.

The built-in adapters register the same way, in this package's own
`pyproject.toml` (stages/gym/python/pyproject.toml); the worker reads that
table directly when the package runs from the checkout, so built-ins need
no install. The test fixtures (`faulty`) are in the group
`embodyflow_gym.fixtures`: found by name, never listed.

    resolve("generic").make("CartPole-v1", {}, 0, max_steps=200, success="survive")
"""

import importlib
import importlib.metadata
import inspect
import os
import sys
import tomllib

from .adapters import BadEnv

GROUP = "embodyflow_gym.adapters"
FIXTURES = "embodyflow_gym.fixtures"
PYPROJECT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")


class UnknownAdapter(Exception):
    """An adapter name no package registers, or one registered twice."""


def checkout_table():
    """The entry-point tables of this package's pyproject.toml (empty when
    the package is installed without it)."""
    try:
        with open(PYPROJECT, "rb") as f:
            return tomllib.load(f).get("project", {}).get("entry-points", {})
    except FileNotFoundError:
        return {}


_REGISTERED = None


def registered(group=GROUP):
    """{name: set of "module:attr" values} of `group`: this package's table
    and every installed distribution's (read once per process: scanning
    the distributions takes ~0.1 s)."""
    global _REGISTERED
    if _REGISTERED is None:
        _REGISTERED = {GROUP: {}, FIXTURES: {}}
        for table, entries in checkout_table().items():
            if table in _REGISTERED:
                for name, value in entries.items():
                    _REGISTERED[table].setdefault(name, set()).add(value)
        installed = importlib.metadata.entry_points()
        for table, found in _REGISTERED.items():
            for entry in installed.select(group=table):
                found.setdefault(entry.name, set()).add(entry.value)
    return _REGISTERED[group]


def names():
    """The adapters a user may name, sorted (fixtures left out)."""
    return sorted(registered())


class Adapter:
    """A resolved adapter: its `make`, the packages it needs and which of
    the optional keywords (`max_steps`, `success`) its make takes."""

    def __init__(self, name, make, module):
        self.name = name
        self.make_fn = make
        self.packages = list(getattr(make, "PACKAGES", None) or getattr(module, "PACKAGES", None) or [])
        parameters = inspect.signature(make).parameters.values()
        every = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters)
        declared = {p.name for p in parameters}
        self.takes = {key for key in ("max_steps", "success") if every or key in declared}

    def make(self, env_id, kwargs, seed, max_steps=None, success=None):
        """An episode of `env_id`; `max_steps` goes to a make that takes it,
        `success` (a rule) too, and a rule for one that does not is bad input."""
        extra = {}
        if "max_steps" in self.takes and max_steps is not None:
            extra["max_steps"] = int(max_steps)
        if success is not None:
            if "success" not in self.takes:
                raise BadEnv(
                    f"a success rule ({success!r}) was given, but this adapter decides success "
                    f"itself (its make takes no `success`); leave gym.success unset"
                )
            extra["success"] = success
        return self.make_fn(env_id, kwargs, seed, **extra)


_RESOLVED = {}


def resolve(name):
    """The adapter `name`: "module:function" as named, else the one entry
    point of that name (the fixtures' group after the users'; a built-in
    name is this package's, whatever else registers it). An unknown
    or twice-registered name raises UnknownAdapter; a module that cannot be
    imported raises ModuleNotFoundError (the worker names the package)."""
    if name in _RESOLVED:
        return _RESOLVED[name]
    if ":" in name:
        value = name
    else:
        # A built-in is found in this package's table without scanning the
        # installed distributions (~0.1 s of every worker's start).
        table = checkout_table()
        builtin = table.get(GROUP, {}).get(name) or table.get(FIXTURES, {}).get(name)
        values = {builtin} if builtin else set(registered().get(name) or registered(FIXTURES).get(name) or ())
        if not values:
            raise UnknownAdapter(
                f"unknown adapter `{name}`; available: {', '.join(names())} (an adapter registers in "
                f"the entry-point group `{GROUP}` of an installed package, or a task names one as "
                f"`module:function`)"
            )
        if len(values) > 1:
            raise UnknownAdapter(f"adapter `{name}` is registered more than once: {', '.join(sorted(values))}")
        (value,) = values
    module_name, _, attr = value.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise UnknownAdapter(
                f"adapter `{name}`: cannot import its module `{module_name}` ({e}) in {sys.executable}: "
                f"install its package there (pip install -e ...) or put it on PYTHONPATH"
            ) from e
        raise
    target = module
    for part in attr.split(".") if attr else []:
        target = getattr(target, part, None)
        if target is None:
            raise UnknownAdapter(f"adapter `{name}`: `{module_name}` has no `{attr}`")
    make = getattr(target, "make", None) if inspect.ismodule(target) else target
    if not callable(make):
        raise UnknownAdapter(f"adapter `{name}`: `{value}` is not a make function nor a module with one")
    adapter = Adapter(name, make, module)
    _RESOLVED[name] = adapter
    return adapter
