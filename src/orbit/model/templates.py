"""Execution templates: named YAML files. Built-ins ship in the package; users add their own."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from orbit.model.errors import InvalidInput, NotFound, describe_validation_error
from orbit.model.models import ExecutionTemplate


@dataclass(frozen=True)
class TemplateSource:
    template: ExecutionTemplate
    path: str  # the file it was read from


def builtin_dir() -> Path:
    return Path(__file__).parent / "builtin_templates"


def default_search_path(home_templates: Path, cwd: Path) -> list[Path]:
    """Later folders win: built-ins, then ./execution_templates/, then $ORBIT_HOME/templates/."""
    return [builtin_dir(), cwd / "execution_templates", home_templates]


def load_template_file(path: Path) -> ExecutionTemplate:
    from orbit.model.launch_modes import check_launch_mode
    from orbit.model.yamlio import load_yaml_mapping

    data = load_yaml_mapping(path)
    try:
        template = ExecutionTemplate.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(str(path), exc, ExecutionTemplate)) from None
    check_launch_mode(template.launch_mode, str(path))  # a typo in a docker setting names the file
    return template


class TemplateRegistry:
    """Templates by id (the file's name). A file is read only when its id is asked for, so one
    broken template breaks that template alone, not every command."""

    def __init__(self, folders: Iterable[Path], *, live: bool = False) -> None:
        """`live`: look at the folders again on every use, and read a file again once it
        changed (a long-running server sees templates added or edited since it started)."""
        self._folders = list(folders)
        self._live = live
        self._seen: tuple[tuple[str, int], ...] = ()
        self._scan(self._files())

    def _files(self) -> list[Path]:
        """The template files, folder by folder in search order, sorted within each."""
        return [
            path
            for folder in self._folders
            if folder.is_dir()
            for path in sorted(folder.glob("*.y*ml"))
        ]

    def _scan(self, files: list[Path]) -> None:
        self._paths = {path.stem: path for path in files}  # a later folder wins
        self._loaded: dict[str, TemplateSource] = {}
        if self._live:
            self._seen = _signature(files)

    def _check(self) -> None:
        """Live: the folders as they are now, read again if any file came, went or changed."""
        if self._live:
            files = self._files()
            if _signature(files) != self._seen:
                self._scan(files)

    def ids(self) -> list[str]:
        self._check()
        return sorted(self._paths)

    def source(self, template_id: str) -> TemplateSource:
        self._check()
        return self._source(template_id)

    def _source(self, template_id: str) -> TemplateSource:
        if template_id in self._loaded:
            return self._loaded[template_id]
        try:
            path = self._paths[template_id]
        except KeyError:
            known = ", ".join(sorted(self._paths)) or "none"
            raise NotFound(f"unknown template '{template_id}' (known: {known})") from None
        template = load_template_file(path)
        if template.id != path.stem:
            raise InvalidInput(
                f"{path}: id: '{template.id}' must match the file name '{path.stem}'"
            )
        self._loaded[template_id] = TemplateSource(template, str(path))
        return self._loaded[template_id]

    def get(self, template_id: str) -> ExecutionTemplate:
        return self.source(template_id).template

    def all(self) -> list[TemplateSource]:
        return [self._source(i) for i in self.ids()]  # ids() looked at the folders once


def _signature(files: list[Path]) -> tuple[tuple[str, int], ...]:
    """Which files there are and when each last changed."""
    found = []
    for path in files:
        try:
            found.append((str(path), path.stat().st_mtime_ns))
        except OSError:
            continue
    return tuple(sorted(found))
