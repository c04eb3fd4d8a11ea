"""docs/SERVICE.md's command-line synopsis is the click command tree: every command it shows
exists and answers ``--help``, with exactly the options, choices, value names and defaults
the synopsis gives, and every command of the tree is in it."""

from __future__ import annotations

import re
from pathlib import Path

import click
from click.testing import CliRunner

from scalewatch.app.cli import cli
from scalewatch.app.settings import Settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "SERVICE.md"
SYNOPSIS = re.search(r"## Command line\n\n```sh\n(.*?)```", PAGE.read_text(), re.S)
OPTION = re.compile(r"\[(-[-\w]+)(?: ([^\]]+))?\]")


def _lines() -> list[list[str]]:
    assert SYNOPSIS is not None, "docs/SERVICE.md has no '## Command line' block"
    return [line.split()[1:] for line in SYNOPSIS.group(1).splitlines() if line.strip()]


def _command(words: list[str]) -> tuple[list[str], click.Command]:
    """The command a synopsis line names (``db upgrade``), and its path."""
    command: click.Command = cli
    path = []
    while isinstance(command, click.Group) and words and words[0] in command.commands:
        path.append(words[0])
        command = command.commands[words.pop(0)]
    return path, command


def _leaves(group: click.Group, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    leaves = set()
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            leaves |= _leaves(command, (*path, name))
        else:
            leaves.add((*path, name))
    return leaves


def _default(option: click.Option, ctx: click.Context) -> str | None:
    """The default as the synopsis shows it: click's, else the setting's behind the option."""
    default = ctx.params[option.name or ""]
    if default is not None:
        return str(default)
    field = Settings.model_fields.get(option.name or "")
    return None if field is None or field.default is None else str(field.default)


def test_every_command_of_the_synopsis_runs_its_help() -> None:
    shown = set()
    for words in _lines():
        path, command = _command(list(words))
        assert not isinstance(command, click.Group), words
        shown.add(tuple(path))
        result = CliRunner().invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert result.stdout.startswith(f"Usage: scalewatch {' '.join(path)} "), result.stdout
    assert shown == _leaves(cli)


def test_the_synopsis_gives_each_commands_options_arguments_and_defaults() -> None:
    for words in _lines():
        path, command = _command(list(words))
        rest = " ".join(words[len(path) :])
        options = {p.opts[-1]: p for p in command.params if isinstance(p, click.Option)}
        arguments = [p for p in command.params if isinstance(p, click.Argument)]
        stated = dict(OPTION.findall(rest))
        # Parsed with a run id where one is taken: the options' values are their defaults.
        ctx = command.make_context(path[-1], ["1"] * len(arguments))
        longest = {opt: opt for opt in options}
        for option in options.values():  # ``-o FILE`` stands for ``-o/--output``
            longest.update({name: option.opts[-1] for name in option.opts})
        assert {longest.get(name, name) for name in stated} == set(options), path
        for name, value in stated.items():
            option = options[longest[name]]
            if option.is_flag:  # ``[--firing]``: shown bare
                assert value == "", (path, name)
            elif isinstance(option.type, click.Choice):
                assert value.split("|") == list(option.type.choices), (path, name)
            elif value.isupper():
                assert value == option.make_metavar(ctx), (path, name)
            else:
                assert value == _default(option, ctx), (path, name)
        positional = OPTION.sub("", rest).split()
        if positional[:1] == ["--"]:  # instrument: the command line after --
            assert [a.metavar for a in arguments] == ["-- COMMAND [ARGS...]"]
        else:
            assert positional == [(a.metavar or a.name or "").upper() for a in arguments], path


ROOT = PAGE.parents[1]
COMMAND_LINE = re.compile(r"^(?:\.venv/bin/)?scalewatch (.+?)(?:\s+#.*)?$", re.M)


def _shown_command_lines() -> list[tuple[str, list[str]]]:
    """Each ``scalewatch ...`` line of a ```sh block of the README and docs/, but the
    synopsis, with the page it is on."""
    shown = []
    for page in [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]:
        for block in re.findall(r"```sh\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            if SYNOPSIS is not None and block == SYNOPSIS.group(1):
                continue
            joined = re.sub(r"\\\n\s*", " ", block)  # a line continued with a backslash
            shown += [(page.name, line.split()) for line in COMMAND_LINE.findall(joined)]
    return shown


def test_the_command_lines_the_pages_show_parse() -> None:
    shown = _shown_command_lines()
    assert {"control", "export", "serve"} <= {words[0] for _, words in shown}
    for page, words in shown:
        path, command = _command(list(words))
        assert not isinstance(command, click.Group), (page, words)
        command.make_context(path[-1], words[len(path) :])  # raises on what click refuses
