"""An interface a lower app declares and a higher one provides once it is ready (its
AppConfig.ready), so that imports between two apps go one way (docs/architecture.md)."""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Provided(Generic[T]):
    """`provided()`: what the higher app provided; RuntimeError naming `what` before that."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._provider: T | None = None

    def provide(self, provider: T) -> None:
        self._provider = provider

    def __call__(self) -> T:
        if self._provider is None:
            raise RuntimeError(f"no installed app provides {self.what}")
        return self._provider
