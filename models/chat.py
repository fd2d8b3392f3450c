"""A conversation as the model reads it: the chat template renders each turn, and the token sequence
grows by what the template adds after the last reply, so earlier turns keep the exact ids the model
read and wrote (the runtime's `hyflash chat`, `bench --chat` and chat regeneration all use this).

A new turn appends what the template adds after the last reply (the end of that turn, the user's
message, the generation prompt), found by rendering the history twice as text: with the new
message, and without it. A template that re-renders earlier turns differently (some drop a
reply's reasoning from the history) has no such extension: the turn is then the whole render.
"""

from __future__ import annotations


class Transcript:
    def __init__(self, tokenizer, system: str | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the model has no chat template (chat_template.jinja, or chat_template in "
                             "tokenizer_config.json)")
        self.tokenizer = tokenizer
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

    def record(self, message: str, prompt: list[int], text: str, reply: list[int]) -> None:
        """The turn is part of the conversation: `prompt` (from `prompt(message)`) and the reply's ids."""
        self.messages += [{"role": "user", "content": message},
                          {"role": "assistant", "content": self.tokenizer.decode(reply, skip_special_tokens=True)}]
        self.text = text + self.tokenizer.decode(reply, skip_special_tokens=False)
        self.ids = prompt + reply

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)
