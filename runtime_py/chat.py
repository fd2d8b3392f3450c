"""A conversation over one Runtime: the chat template renders each turn (`hyflash.models.chat`), and
the runtime keeps the target's cache and the drafter's window and state between turns, so a turn
prefills only itself (a template that re-renders earlier turns differently prefills the whole
render, and `Stats.prefilled` shows it).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

from hyflash.models.chat import Transcript
from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats


def no_template(folder) -> str:
    return (f"{folder}: this export has no chat template (its target folder had none: chat_template.jinja, "
            "or chat_template in tokenizer_config.json); use --prompt")


class Conversation:
    """Turn t samples with seed cfg.seed + t (greedy turns do not depend on it)."""

    def __init__(self, runtime: Runtime, tokenizer, cfg: GenerationConfig, system: str | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(no_template(runtime.folder))
        self.runtime, self.cfg = runtime, cfg
        self.transcript = Transcript(tokenizer, system)
        self.turns = 0

    def prompt(self, message: str) -> tuple[list[int], str]:
        """The conversation with `message` as the user's next turn, ready for the reply: (tokens, text)."""
        return self.transcript.prompt(message)

    def turn(self, message: str, stats: Stats) -> Iterator[list[int]]:
        """Yield the reply's tokens as they are committed; the conversation then holds the turn (also when
        the caller stops early, at a stop string: the reply is then what was yielded). A turn refused
        (a prompt past the usable context) leaves the conversation as it was."""
        prompt, text = self.transcript.prompt(message)
        cfg = dataclasses.replace(self.cfg, seed=self.cfg.seed + self.turns)
        try:
            yield from self.runtime.generate(prompt, cfg, stats, reuse=True)
        except GeneratorExit:
            self._record(message, prompt, text, stats.tokens)
            raise
        self._record(message, prompt, text, stats.tokens)

    def _record(self, message: str, prompt: list[int], text: str, reply: list[int]) -> None:
        self.transcript.record(message, prompt, text, reply)
        self.turns += 1

    @property
    def ids(self) -> list[int]:
        return self.transcript.ids
