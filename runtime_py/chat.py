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

from typing import Iterator

from hyflash.runtime_py.loop import GenerationConfig, Runtime, Stats


class Conversation:
    def __init__(self, runtime: Runtime, tokenizer, cfg: GenerationConfig, system: str | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"{runtime.folder}: this export has no chat template (its target folder had none: "
                             "chat_template.jinja, or chat_template in tokenizer_config.json); use --prompt")
        self.runtime, self.tokenizer, self.cfg = runtime, tokenizer, cfg
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
        the caller stops early, at a stop string: the reply is then what was yielded)."""
        prompt, text = self.prompt(message)
        try:
            yield from self.runtime.generate(prompt, self.cfg, stats, reuse=True)
        finally:
            reply = stats.tokens
            self.messages += [{"role": "user", "content": message},
                              {"role": "assistant", "content": self.tokenizer.decode(reply, skip_special_tokens=True)}]
            self.text = text + self.tokenizer.decode(reply, skip_special_tokens=False)
            self.ids = prompt + reply

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)
