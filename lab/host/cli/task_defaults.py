"""invoke.yaml's section of a task, checked: each key is one of the task's settings, and
a misspelt one is one sentence naming the closest (invoke itself would drop it without a
word, and the task would run with the kit's default)."""
from __future__ import annotations

import difflib


class TaskDefaultsError(ValueError):
    """A key of invoke.yaml the task does not have."""


def section(config, name: str, allowed) -> dict:
    """The task's section of invoke.yaml (`config`: invoke's Config, or a dict) as a dict,
    every key one of `allowed`."""
    values = dict(config.get(name, {}) or {})
    allowed = sorted(allowed)
    for key in sorted(values):
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"it takes {', '.join(allowed)}"
            raise TaskDefaultsError(f"invoke.yaml's {name}: has no setting {key!r}: {hint}")
    return values


def settings_of(task) -> set[str]:
    """The settings an invoke task takes: its parameters but the context."""
    import inspect
    body = getattr(task, "body", task)
    return {p for p in inspect.signature(body).parameters if p != "c"}
