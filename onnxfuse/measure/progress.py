"""A benchmark's progress through its named steps, on a rich progress bar when there is one."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress


class Steps:
    """Advance a rich progress bar through named steps (or do nothing without one)."""

    def __init__(self, progress: Progress | None, names: list[str]):
        self.progress, self.names, self.done = progress, names, 0
        self.task = progress.add_task(names[0], total=len(names)) if progress else None

    def __call__(self) -> None:
        self.done += 1
        if self.progress:
            following = self.names[self.done] if self.done < len(self.names) else "done"
            self.progress.update(self.task, advance=1, description=following)
