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
#: Worked examples: they show the small model the one-expression habit, and they make the head
#: long and shared, as real agents' few-shot tool prompts are (the cache serves it every call).
REASONING_EXAMPLES = (
    "\n\n## Worked examples\n\n"
    "Problem: A shop has 7 shelves with 35 cans each. It sells 98 cans. How many cans are left?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"7*35-98\"}}\nObservation: 147\n{\"answer\":\"147\"}\n\nProblem: A bus leaves at 08:25 and arrives at 11:05. How many minutes is the trip?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"(11*60+5)-(8*60+25)\"}}\nObservation: 160\n{\"answer\":\"160\"}\n\nProblem: Five friends share a bill of 235 dollars equally. How much does each pay?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"235/5\"}}\nObservation: 47\n{\"answer\":\"47\"}\n\nProblem: A farmer has 14 cows and buys 3 herds of 12 cows, then sells 9. How many cows does he have?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"14+3*12-9\"}}\nObservation: 41\n{\"answer\":\"41\"}\n\nProblem: The sum of two consecutive even numbers is 86. What is the smaller one?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"(86-2)/2\"}}\nObservation: 42\n{\"answer\":\"42\"}\n\nProblem: A rectangle is 18 cm long and 7 cm wide. What is its perimeter in cm?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"2*(18+7)\"}}\nObservation: 50\n{\"answer\":\"50\"}\n\nProblem: Notebooks cost 4 dollars each or 11 dollars for 3. What is the lowest price for 7 notebooks?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"min(7*4, 11+4*4, 2*11+4)\"}}\nObservation: 26\n{\"answer\":\"26\"}\n\nProblem: A tank holds 640 litres and drains 32 litres per minute. After how many minutes is it empty?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"640/32\"}}\nObservation: 20\n{\"answer\":\"20\"}\n\nProblem: Anna is 3 times as old as Ben. Ben is 9. How old will Anna be in 5 years?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"3*9+5\"}}\nObservation: 32\n{\"answer\":\"32\"}\n\nProblem: A class of 28 pupils splits into teams of 4. How many teams are there?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"28//4\"}}\nObservation: 7\n{\"answer\":\"7\"}\n\nProblem: A runner does 12 laps of 400 metres and then 1500 metres more. How many metres in total?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"12*400+1500\"}}\nObservation: 6300\n{\"answer\":\"6300\"}\n\nProblem: Pia saves 15 dollars a week for 9 weeks and spends 48 dollars. How much is left?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"15*9-48\"}}\nObservation: 87\n{\"answer\":\"87\"}\n\nProblem: A box of 250 screws is shared by 6 workers, each taking the same whole number. How many are left over?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"250%6\"}}\nObservation: 4\n{\"answer\":\"4\"}\n\nProblem: A car uses 6 litres per 100 km. How many litres for 450 km?\n{\"tool\":\"calculator\",\"arguments\":{\"expression\":\"6*450/100\"}}\nObservation: 27\n{\"answer\":\"27\"}"
)
REASONING_TASK = "{question}"
CALCULATOR_DOC = "Evaluate one arithmetic expression and return its value."

CHAT_SYSTEM = "You are a helpful assistant. Answer briefly."
