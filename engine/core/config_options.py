"""Config fields that carry their own CLI flag, settings-file key and help text (pure Python).

The config dataclasses (engine/config.py, engine/scheduler/config.py, engine/kv/config.py) are the one
place each engine default is written (a default the operator or the sidecar also writes comes from the
table in engine/core/defaults.py): a field declared with `option(...)` becomes a `kvloop` flag
(`add_config_args`, read back by `config_from_args`) and a key of the operator's engine.yaml
(engine/settings_file.py), both with the field's own default."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvloop.engine.core.defaults import Default

_META_KEY = "kvloop_option"


@dataclass(frozen=True)
class Option:
    help: str
    flag: str | None = None  # "--max-num-seqs"; None: not a command-line flag
    setting: str | None = None  # "scheduler.max_num_seqs" (section.key) in engine.yaml; None: not in the file
    # the allowed values, or a function listing them (a registry's names), called when the parser is built
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None

    def choice_list(self) -> list[str] | None:
        if self.choices is None:
            return None
        return list(self.choices() if callable(self.choices) else self.choices)


def option(default: Any = dataclasses.MISSING, *, help: str, flag: str | None = None,
           setting: str | None = None,
           choices: Sequence[str] | Callable[[], Sequence[str]] | None = None) -> Any:
    """A dataclass field whose default is `default` (a defaults-table entry: its value), exposed as `flag`
    and/or settings key `setting`."""
    if isinstance(default, Default):
        default = default.value
    return dataclasses.field(default=default,
                             metadata={_META_KEY: Option(help, flag, setting, choices)})


@dataclass(frozen=True)
class ConfigOption:
    path: str  # dotted field path from the top config: "scheduler.max_num_seqs"
    kind: type  # int, float or str (an Optional's inner type)
    default: Any
    option: Option

    @property
    def dest(self) -> str:
        """The argparse attribute: the flag's own name, so callers keep reading args.max_num_seqs."""
        return self.option.flag.lstrip("-").replace("-", "_") if self.option.flag else self.path

    def coerce(self, value: Any) -> Any:
        """A settings-file value as the field's type (YAML may give 64 for a float, "8" for an int)."""
        return value if value is None or self.kind is str else self.kind(value)


def _inner_type(hint: Any) -> Any:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return inner
    return hint


def config_options(cls: type, prefix: str = "") -> Iterator[ConfigOption]:
    """Every option field of cls and of the config dataclasses nested in it, in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = _inner_type(hints[f.name])
        if dataclasses.is_dataclass(kind):
            yield from config_options(kind, f"{prefix}{f.name}.")
        elif _META_KEY in f.metadata:
            yield ConfigOption(prefix + f.name, kind, f.default, f.metadata[_META_KEY])


def build_config(cls: type, values: dict[str, Any]) -> Any:
    """cls(...) from values keyed by dotted field path; fields not given keep their dataclass defaults.
    Nested configs are built first, so the top config's __post_init__ sees them complete."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for path, value in values.items():
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            kwargs[head] = value
    for name, sub in nested.items():
        kwargs[name] = build_config(_inner_type(hints[name]), sub)
    return cls(**kwargs)


def add_config_args(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per option field that has one, its default the field's; the help shows the default."""
    for opt in config_options(cls):
        if opt.option.flag is None:
            continue
        text = opt.option.help
        if "default" not in text:
            text += " (default: %(default)s)"
        parser.add_argument(opt.option.flag, dest=opt.dest, type=opt.kind, default=opt.default,
                            choices=opt.option.choice_list(), help=text)


def config_from_args(cls: type, args: argparse.Namespace, **fixed: Any) -> Any:
    """The config the flags of add_config_args describe; `fixed` sets fields by dotted path on top."""
    values = {opt.path: getattr(args, opt.dest) for opt in config_options(cls) if opt.option.flag is not None}
    return build_config(cls, {**values, **fixed})
