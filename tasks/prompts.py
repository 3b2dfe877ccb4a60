"""Every piece of prompt text the task suites write, in one place.

Nothing here may contain timestamps or random ids: the QA head (system + numbered document) must be
byte-identical for every question of a document, so that it is prefilled once and then reused.
"""

from __future__ import annotations

DOCUMENT_TITLE = "{name}"
QA_TASK = "{question}"

REASONING_SYSTEM = (
    "Solve the problem step by step. Use the calculator for every computation: it evaluates one "
    "arithmetic expression (+ - * / // % ** and parentheses, min, max, abs, round). When you know the "
    "result, give the final answer as a number or a name, without units."
)
#: Worked examples (problem, expression, result): a section of the cached system prompt that shows the
#: small model the one-expression habit, prefilled once.
REASONING_EXAMPLES: tuple[tuple[str, str, str], ...] = (
    ("A shop has 7 shelves with 35 cans each. It sells 98 cans. How many cans are left?", "7*35-98", "147"),
    (
        "A bus leaves at 08:25 and arrives at 11:05. How many minutes is the trip?",
        "(11*60+5)-(8*60+25)",
        "160",
    ),
    ("Five friends share a bill of 235 dollars equally. How much does each pay?", "235/5", "47"),
    (
        "A farmer has 14 cows and buys 3 herds of 12 cows, then sells 9. How many cows does he have?",
        "14+3*12-9",
        "41",
    ),
    ("The sum of two consecutive even numbers is 86. What is the smaller one?", "(86-2)/2", "42"),
    ("A rectangle is 18 cm long and 7 cm wide. What is its perimeter in cm?", "2*(18+7)", "50"),
    (
        "Notebooks cost 4 dollars each or 11 dollars for 3. What is the lowest price for 7 notebooks?",
        "min(7*4, 11+4*4, 2*11+4)",
        "26",
    ),
    (
        "A tank holds 640 litres and drains 32 litres per minute. After how many minutes is it empty?",
        "640/32",
        "20",
    ),
    ("Anna is 3 times as old as Ben. Ben is 9. How old will Anna be in 5 years?", "3*9+5", "32"),
    ("A class of 28 pupils splits into teams of 4. How many teams are there?", "28//4", "7"),
    (
        "A runner does 12 laps of 400 metres and then 1500 metres more. How many metres in total?",
        "12*400+1500",
        "6300",
    ),
    ("Pia saves 15 dollars a week for 9 weeks and spends 48 dollars. How much is left?", "15*9-48", "87"),
    (
        "A box of 250 screws is shared by 6 workers, each taking the same whole number. How many are left over?",
        "250%6",
        "4",
    ),
    ("A car uses 6 litres per 100 km. How many litres for 450 km?", "6*450/100", "27"),
)
REASONING_EXAMPLES_SECTION = "\n\n## Worked examples\n\n{examples}"
REASONING_EXAMPLE = "Problem: {problem}\n{call}\nObservation: {result}\n{answer}"
REASONING_TASK = "{question}"
#: The task turn with the worked example most like the problem first (the head keeps all of them,
#: byte-stable): a small model copies the structure of the example it read last.
REASONING_TASK_WITH_EXAMPLE = (
    "A solved problem like this one:\nProblem: {problem}\nExpression: {expression}\n\n"
    "Now solve this problem with one expression:\n{question}"
)
CALCULATOR_DOC = "Evaluate one arithmetic expression and return its value."
CALCULATOR_REPEATED = (
    "this expression gives {value}, an answer already rejected: write a different expression for the problem"
)

CHAT_SYSTEM = "You are a helpful assistant. Answer briefly."

# ---- QA agent (tasks/qa.py): system, tool, worked examples ------------------------------------

QA_AGENT_SYSTEM = (
    "Answer questions about the document below. Its paragraphs are numbered [P1], [P2], and so on. "
    "First call search_document with the key words of the question: it returns the matching sentences, "
    "each after its paragraph id. Then answer with the few words of those sentences that answer the "
    'question, copied exactly, or "not found" when they do not say.'
)
QA_SEARCH_DOC = "Search the document; returns the sentences that best match, each after its paragraph id."
QA_NO_MATCH = (
    'No sentence of the document matches these words. If the document does not say, answer "not found".'
)
QA_NOT_FOUND = "not found"
#: Worked examples for the QA head, most generic first (the head-length sweep takes a prefix):
#: (question, query, observation, answer). They are about invented documents: the agent learns the
#: moves (search with the question's key words, copy the answering words), never these facts.
QA_EXAMPLES: tuple[tuple[str, str, str, str], ...] = (
    (
        "Where did Omar park the blue van?",
        "Omar park blue van",
        "[P2] Omar parked the blue van behind the old mill near the river.",
        "behind the old mill near the river",
    ),
    (
        "What is the password of the attic safe?",
        "password attic safe",
        "[P12] The password of the attic safe is 8141.\n[P3] Nobody had opened the attic for years.",
        "8141",
    ),
    (
        "In which country does Karim's brother work?",
        "Karim brother work country",
        "[P3] Karim's brother is Selim.\n[P14] Selim works in Chile.",
        "Chile",
    ),
    (
        "What did Mia plant in the garden?",
        "Mia plant garden",
        "[P10] Mia planted three rows of tulips along the fence in the garden.",
        "three rows of tulips along the fence",
    ),
    (
        "Who repaired the old clock?",
        "repaired old clock",
        "[P5] The old clock was repaired by Ruth Okafor in the spring.",
        "Ruth Okafor",
    ),
    (
        "What is the name of the captain's horse?",
        "captain horse name",
        "[P4] The captain kept a small boat in the bay.",
        "not found",
    ),
    (
        "What is the most pleasant way to spend a morning in Bergen?",
        "pleasant way morning Bergen",
        "[P7] The most pleasant way to spend a morning in Bergen is to take the cable car up the hill.\n"
        "[P9] Bergen is a rainy city.",
        "to take the cable car up the hill",
    ),
    (
        "What colour is the umbrella that Lena bought?",
        "Lena umbrella colour",
        "[P6] Lena bought a green umbrella at the station kiosk.",
        "green",
    ),
)
