"""Print a `hyflash bench --chat` JSON report as Markdown tables (pooled, then by category).

Usage: .venv/bin/python scripts/chat_table.py REPORT.json [--pooled-only]
"""

import json
import sys
from pathlib import Path

from hyflash.runtime_py.chatbench import markdown_chat

if __name__ == "__main__":
    report = json.loads(Path(sys.argv[1]).read_text())
    print(markdown_chat(report, categories="--pooled-only" not in sys.argv))
