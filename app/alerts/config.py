"""The alert rules a service applies: the default set, or a TOML rules file.

>>> config = parse_rules('[[rule]]\\nname = "skips"\\nkind = "skip_rate"\\nwindow = 50\\n')
>>> [(rule.name, rule.params.threshold) for rule in config.rules]
[('skips', 0.05)]
>>> try:
...     parse_rules('[[rule]]\\nname = "skips"\\nkind = "skip_rate"\\nwindow = 0\\n')
... except RulesFileError as error:
...     print(error)
rules file, line 4: rule 1 ('skips'): window: Input should be greater than 0
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, ValidationError

from scalewatch.store.autopilot import validate_autopilot
from scalewatch.store.errors import ControlValidationError

from .kinds import KINDS, Params, RunView

__all__ = [
    "AlertConfig",
    "AutopilotRule",
    "Rule",
    "RulesFileError",
    "Webhook",
    "default_rules",
    "load_rules",
    "parse_rules",
]


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str
    params: Params
    run: str = "*"  # a glob of the run names it applies to

    def applies_to(self, run: RunView) -> bool:
        return fnmatch.fnmatchcase(run.name, self.run) and KINDS[self.kind].applies(run)


class Webhook(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: AnyHttpUrl
    timeout_s: float = Field(default=5.0, gt=0, le=60)


@dataclass(frozen=True)
class AutopilotRule:
    """An ``[[autopilot]]`` table: the autopilot turned on, with ``settings`` (the body of
    a ``PUT /api/runs/{run}/autopilot``), for each running run whose name the glob ``run``
    matches and whose autopilot was never set."""

    run: str
    settings: dict[str, Any]

    def applies_to(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.run)


@dataclass(frozen=True)
class AlertConfig:
    rules: tuple[Rule, ...]
    webhooks: tuple[Webhook, ...] = field(default=())
    autopilots: tuple[AutopilotRule, ...] = field(default=())


def default_rules() -> tuple[Rule, ...]:
    """One rule per registered kind, named as the kind, with its parameters' defaults."""
    return tuple(
        Rule(name, name, spec.params.model_validate({}))
        for name, spec in KINDS.items()
        if spec.default
    )


class RulesFileError(ValueError):
    """A rules file that cannot be used: where (``line``, when known) and why."""

    def __init__(self, source: str, reason: str, line: int | None = None) -> None:
        self.source, self.reason, self.line = source, reason, line
        where = source if line is None else f"{source}, line {line}"
        super().__init__(f"{where}: {reason}")


class _Head(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=100)
    kind: str
    run: str = Field(default="*", min_length=1, max_length=200)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    webhook: list[Webhook] = []
    rule: list[dict[str, Any]] = []
    autopilot: list[dict[str, Any]] = []


def load_rules(path: Path) -> AlertConfig:
    """The rules of the file at ``path``; :class:`RulesFileError` says what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise RulesFileError(str(path), f"cannot be read: {error}") from None
    return parse_rules(text, source=str(path))


def parse_rules(text: str, source: str = "rules file") -> AlertConfig:
    """Rules from the TOML ``text``; its ``[[rule]]`` tables replace the default set (a
    file of webhooks alone keeps it)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        match = re.search(r"\(at line (\d+), column \d+\)", str(error))
        line = int(match.group(1)) if match else None
        if line is None and "end of document" in str(error):
            line = max(1, len(text.splitlines()))
        reason = str(error).split(" (at line")[0]
        raise RulesFileError(source, f"not TOML: {reason}", line) from None
    try:
        parsed = _File.model_validate(data)
    except ValidationError as error:
        raise _refused(error, text, source, ()) from None
    rules = []
    for index, table in enumerate(parsed.rule):
        rules.append(_rule(table, index, text, source))
    names = [rule.name for rule in rules]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise RulesFileError(
                source,
                f"rule {index + 1} ({name!r}): name: another rule is called so",
                _line_of(text, "rule", index, "name"),
            )
    return AlertConfig(
        tuple(rules) if rules else default_rules(),
        tuple(parsed.webhook),
        tuple(
            _autopilot(table, index, text, source) for index, table in enumerate(parsed.autopilot)
        ),
    )


def _autopilot(table: dict[str, Any], index: int, text: str, source: str) -> AutopilotRule:
    """An ``[[autopilot]]`` table checked by the autopilot's own rules (the store's)."""
    label = f"autopilot {index + 1}"
    run = table.get("run")
    if not isinstance(run, str) or not 0 < len(run) <= 200:
        reason = f"{label}: run: a glob of run names is required (1 to 200 characters)"
        raise RulesFileError(source, reason, _line_of(text, "autopilot", index, "run"))
    settings = {"enabled": True, **{k: v for k, v in table.items() if k != "run"}}
    try:
        validate_autopilot(settings, {})  # a run's max_scale is checked when it is applied
    except ControlValidationError as error:
        name, reason = next(iter(error.errors.items()))
        line = _line_of(text, "autopilot", index, name)
        raise RulesFileError(source, f"{label}: {reason}", line) from None
    return AutopilotRule(run, settings)


def _rule(table: dict[str, Any], index: int, text: str, source: str) -> Rule:
    label = f"rule {index + 1}"
    if isinstance(table.get("name"), str):
        label += f" ({table['name']!r})"
    try:
        head = _Head.model_validate(table)
    except ValidationError as error:
        raise _refused(error, text, source, ("rule", index), label) from None
    spec = KINDS.get(head.kind)
    if spec is None:
        known = ", ".join(sorted(KINDS))
        raise RulesFileError(
            source,
            f"{label}: kind: {head.kind!r} is no rule kind (one of {known})",
            _line_of(text, "rule", index, "kind"),
        )
    rest = {key: value for key, value in table.items() if key not in _Head.model_fields}
    try:
        params = spec.params.model_validate(rest)
    except ValidationError as error:
        raise _refused(error, text, source, ("rule", index), label) from None
    return Rule(head.name, head.kind, params, head.run)


def _refused(
    error: ValidationError,
    text: str,
    source: str,
    within: tuple[str | int, ...],
    label: str = "",
) -> RulesFileError:
    """The first problem pydantic found, named as the file names it, with its line."""
    detail = error.errors()[0]
    loc = (*within, *detail["loc"])
    table = str(loc[0]) if loc else ""
    index = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    name = ".".join(str(part) for part in loc[2:]) if index is not None else ""
    if not label:
        label = f"{table} {index + 1}" if index is not None else table
    key = str(loc[2]) if len(loc) > 2 else None
    if index is not None:
        line = _line_of(text, table, index, key)
    else:
        line = _line_of(text, table) or _top_level_line(text, table)
    reason = f"{name}: {detail['msg']}" if name else detail["msg"]
    return RulesFileError(source, f"{label}: {reason}" if label else reason, line)


def _top_level_line(text: str, key: str) -> int | None:
    """The line that sets ``key`` at the top of ``text``, before any table."""
    assignment = re.compile(rf"^\s*{re.escape(key)}\s*=|^\s*\[+\s*{re.escape(key)}\s*\]")
    for number, line in enumerate(text.splitlines(), 1):
        if assignment.match(line):
            return number
    return None


def _line_of(text: str, table: str, index: int | None = None, key: str | None = None) -> int | None:
    """The line of ``key`` in the ``index``-th ``[[table]]`` of ``text`` (1-based), else
    of that table's header; None when neither is found."""
    header = re.compile(rf"^\s*\[\[\s*{re.escape(table)}\s*\]\]")
    count, start = -1, None
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if header.match(line):
            count += 1
            if index is None or count == index:
                start = number
                break
    if start is None:
        return None
    if key is None:
        return start
    assignment = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for number in range(start + 1, len(lines) + 1):
        line = lines[number - 1]
        if line.lstrip().startswith("["):
            break
        if assignment.match(line):
            return number
    return start
