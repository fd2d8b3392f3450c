"""Libraries' INFO/WARNING log lines held back while they import, trace or load (the progress bar and the
one-line errors are ours); their errors still show."""

from __future__ import annotations

import contextlib
import logging


@contextlib.contextmanager
def quiet_loggers(*names: str):
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
