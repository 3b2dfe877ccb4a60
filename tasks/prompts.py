"""Every piece of prompt text the task suites write, in one place.

Nothing here may contain timestamps or random ids: the QA head (system + numbered document) must be
byte-identical for every question of a document, so that it is prefilled once and then reused.
"""

from __future__ import annotations

QA_SYSTEM = (
    "Answer questions about the document below using only its text. Each line starts with its number "
    "(L1, L2, ...). Give a short answer copied from the document, then the numbers of the lines it comes "
    "from in brackets."
)
DOCUMENT_TITLE = "{name}"
QA_TASK = "{question}"
SEARCH_TOOL_DOC = "Search the document for words; returns the best matching passages with their line numbers."
PASSAGE_SEPARATOR = "\n...\n"
NO_PASSAGES = "no lines match these words"

REASONING_SYSTEM = (
    "Solve the problem step by step. Use the calculator for every computation: it evaluates one "
    "arithmetic expression (+ - * / // % ** and parentheses, min, max, abs, round). When you know the "
    "result, give the final answer as a number or a name, without units."
)
REASONING_TASK = "{question}"
CALCULATOR_DOC = "Evaluate one arithmetic expression and return its value."

CHAT_SYSTEM = "You are a helpful assistant. Answer briefly."
