"""A flag invoke does not know, answered with the closest one; bench's help in groups. invoke's parser says only
"No idea what '--gpus' is!" (invoke/parser/parser.py, Parser.parse_argv, invoke 2.2);
Program.run prints a ParseError's message and exits 1 (invoke/program.py). Installed
from tasks.py, this wraps Program.parse_tasks so that the message names the task, the
closest flag (difflib) or what a flag of other tools means here, and its --help; it
exits 2, as the tasks' own refusals of bad input do (an Exit, which Program.run prints)."""
from __future__ import annotations

import difflib
import re

from lab.host.cli.flag_help import BENCH_EXAMPLES, BENCH_GROUPS

# What users of other launchers type, and this kit's way to say it.
SYNONYMS = {
    "--gpus": "use --np N --device cuda (one GPU per rank)",
    "--gpu": "use --device cuda",
    **{f: "use --np" for f in ("--nproc-per-node", "--nproc", "--num-proc", "--workers",
                               "--world-size", "--ranks")},
    "--lr": "the learning rate is the model's own, scaled by the data-parallel width (no flag sets it)",
    "--dataset": "use --data", "--batch": "use --batch-size", "--steps": "use --max-steps",
}
UNKNOWN = re.compile(r"^No idea what '(?P<token>[^']+)' is!$")
# invoke/parser/parser.py (ParseMachine.complete_flag): a flag at the end of the line
NO_VALUE = re.compile(r"^Flag <Argument: (?P<name>[\w-]+)[^>]*> needed value and was not given one!$")


def hint(message: str, context, tasks=()) -> str:
    """The message of a ParseError, with the closest flag of the task when it is an
    unknown flag, or the closest of `tasks` when it is an unknown task (else as it was)."""
    m = UNKNOWN.match(str(message))
    flags = sorted(getattr(context, "flags", {}) or {}) if context is not None else []
    task = getattr(context, "name", None)
    needs = NO_VALUE.match(str(message))
    if needs and task:
        flag = "--" + needs.group("name").replace("_", "-")
        return f"error: `invoke {task}` {flag} needs a value (`invoke {task} --help` says what it takes)"
    # `invoke report --results-dir DIR`: invoke gives the task's positional argument the
    # unknown flag and finds DIR left over; the flag is what the user got wrong.
    taken = [a for a in getattr(context, "positional_args", None) or []
             if isinstance(a.value, str) and a.value.startswith("-")] if task else []
    if m and taken and not m.group("token").startswith("-"):
        line = hint(f"No idea what '{taken[0].value}' is!", context)
        name = taken[0].name
        return line.replace(" (`invoke", f"; the {name} is given without a flag (`invoke {task} "
                                         f"{name.upper()}`; `invoke", 1)
    if m and not m.group("token").startswith("-") and tasks:
        close = difflib.get_close_matches(m.group("token"), sorted(tasks), n=1)
        say = f"did you mean `invoke {close[0]}`?" if close else "`invoke --list` lists them"
        return f"error: no task {m.group('token')!r}: {say}"
    if not m or not task or not m.group("token").startswith("-"):
        return str(message)
    token = m.group("token").split("=", 1)[0]
    if token in SYNONYMS:
        say = SYNONYMS[token]
    else:
        close = difflib.get_close_matches(token, flags, n=1, cutoff=0.6)
        say = f"did you mean {close[0]}?" if close else "it takes none of that name"
    return f"error: `invoke {task}` has no flag {token}: {say} (`invoke {task} --help` lists them)"


def grouped_help(program, name: str, groups: dict, examples) -> None:
    """invoke's task help (Program.print_task_help: usage, docstring, options) with the
    options in `groups`, in their order, then `examples` (command, what it does)."""
    ctx = program.parser.contexts[name]
    tuples = ctx.help_tuples()
    program.print_task_help_plain(name, options=False)
    by_flag = {}
    for t in tuples:
        m = re.search(r"--(?:\[no-\])?([\w-]+)", t[0])
        by_flag[m.group(1) if m else t[0]] = t
    left = dict(by_flag)
    titles = list(groups)
    for title in titles:
        rows = [left.pop(f) for f in groups[title] if f in left]
        if title == titles[-1]:
            rows += list(left.values())
        if rows:
            print(f"Options, {title}:")
            program.print_columns(rows)
    print("Examples:")
    for cmd, what in examples:
        print(f"{program.leading_indent}# {what}")
        print(f"{program.leading_indent}{cmd}")
    print("")


def install() -> None:
    """Wrap invoke's Program.parse_tasks once (tasks.py calls this when invoke loads it),
    and print `invoke bench --help` in groups with examples."""
    from invoke.exceptions import ParseError
    from invoke.program import Program
    if getattr(Program.parse_tasks, "lab_hints", False):
        return
    original = Program.parse_tasks
    plain = Program.print_task_help

    def print_task_help_plain(self, name, options=True):
        if options:
            return plain(self, name)
        # the usage line and the docstring as invoke prints them, without its options
        import contextlib
        import io
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            plain(self, name)
        text = buf.getvalue()
        print(text[:text.index("Options:")], end="")

    def print_task_help(self, name):
        if name == "bench":
            return grouped_help(self, name, BENCH_GROUPS, BENCH_EXAMPLES)
        return plain(self, name)
    Program.print_task_help_plain = print_task_help_plain
    Program.print_task_help = print_task_help

    def parse_tasks(self):
        try:
            original(self)
        except ParseError as e:
            tasks = getattr(getattr(self, "collection", None), "task_names", {}) or {}
            line = hint(str(e), e.context, tasks)
            # bad input: one line, exit 2, as every task's own refusal
            from invoke.exceptions import Exit
            raise Exit(line if line.startswith("error: ") else f"error: {line}", code=2) from None
    parse_tasks.lab_hints = True
    Program.parse_tasks = parse_tasks
