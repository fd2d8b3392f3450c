"""A conversation over one Runtime: the chat template renders each turn, and the runtime keeps the
target's cache and the drafter's window and state between turns, so a turn prefills only itself.

The conversation is a token sequence: every prompt and reply as the model read and wrote it. A
new turn appends what the template adds after the last reply (the end of that turn, the user's
message, the generation prompt), found by rendering the history twice as text: with the new
message, and without it. A template that re-renders earlier turns differently (some drop a
reply's reasoning from the history) has no such extension: the turn is then the whole render,
prefilled from the start, and `Stats.prefilled` shows it.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats


def no_template(folder) -> str:
    return (f"{folder}: this export has no chat template (its target folder had none: chat_template.jinja, "
            "or chat_template in tokenizer_config.json); use --prompt")


class Conversation:
    """Turn t samples with seed cfg.seed + t (greedy turns do not depend on it)."""

    def __init__(self, runtime: Runtime, tokenizer, cfg: GenerationConfig, system: str | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(no_template(runtime.folder))
        self.runtime, self.tokenizer, self.cfg = runtime, tokenizer, cfg
        self.turns = 0
        self.messages: list[dict] = [{"role": "system", "content": system}] if system else []
        self.ids: list[int] = []  # the conversation as tokens: prompts and replies, in order
        self.text = ""  # the same conversation as text (what the template rendered, then the replies)

    def prompt(self, message: str) -> tuple[list[int], str]:
        """The conversation with `message` as the user's next turn, ready for the reply: (tokens, text)."""
        messages = [*self.messages, {"role": "user", "content": message}]
        full = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if self.ids and full.startswith(self.text):
            return self.ids + self._encode(full[len(self.text):]), full
        return self._encode(full), full

    def turn(self, message: str, stats: Stats) -> Iterator[list[int]]:
        """Yield the reply's tokens as they are committed; the conversation then holds the turn (also when
        the caller stops early, at a stop string: the reply is then what was yielded). A turn refused
        (a prompt past the usable context) leaves the conversation as it was."""
        prompt, text = self.prompt(message)
        cfg = dataclasses.replace(self.cfg, seed=self.cfg.seed + self.turns)
        try:
            yield from self.runtime.generate(prompt, cfg, stats, reuse=True)
        except GeneratorExit:
            self._record(message, prompt, text, stats.tokens)
            raise
        self._record(message, prompt, text, stats.tokens)

    def _record(self, message: str, prompt: list[int], text: str, reply: list[int]) -> None:
        self.messages += [{"role": "user", "content": message},
                          {"role": "assistant", "content": self.tokenizer.decode(reply, skip_special_tokens=True)}]
        self.text = text + self.tokenizer.decode(reply, skip_special_tokens=False)
        self.ids = prompt + reply
        self.turns += 1

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)
