"""Needle facts: short sentences with simple lookup answers, drawn from templates with a seeded rng.

Values are random (codes, numbers, invented pairings), so a model cannot answer from world knowledge:
only reading the document helps. Within one document every subject (door colour, person, city) is
used once, so each question has exactly one supporting sentence (two for multi-hop ones).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

COLORS = ("blue", "red", "green", "yellow", "purple", "orange", "silver", "golden", "white", "black")
NAMES = (
    "Elena",
    "Marcus",
    "Priya",
    "Tomas",
    "Aiko",
    "Farid",
    "Greta",
    "Kwame",
    "Lucia",
    "Nikolai",
    "Sofia",
    "Omar",
    "Ingrid",
    "Rafael",
    "Yuki",
    "Bruno",
    "Amara",
    "Dmitri",
    "Hana",
    "Jonas",
)
CITIES = ("Lisbon", "Oslo", "Nairobi", "Montreal", "Kyoto", "Valparaiso", "Tallinn", "Adelaide", "Porto")
ACTIVITIES = (
    "eat a sandwich in Dolores Park",
    "ride the old ferry at sunrise",
    "climb the clock tower at noon",
    "swim in the northern lake",
    "listen to jazz in the harbour cellar",
    "walk across the red bridge at dusk",
    "buy warm bread at the night market",
    "watch the kite festival on the beach",
)
HIDING_PLACES = ("red flowerpot", "doormat", "loose brick by the gate", "blue watering can", "garden gnome")
ANIMALS = ("cat", "dog", "parrot", "tortoise", "rabbit", "goldfish")
PET_NAMES = ("Biscuit", "Pepper", "Mango", "Ziggy", "Clover", "Noodle", "Waffle", "Pixel")
FRUITS = ("apples", "pears", "oranges", "plums", "lemons", "peaches")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


@dataclass(frozen=True, slots=True)
class Fact:
    """One question and the sentences (needles) that answer it; `answers` are the acceptable golds.

    `sentences` are inserted into the document for this fact; `support` names further supporting
    sentences that another fact inserts (a question about the same chain).
    """

    kind: str
    template: str
    sentences: tuple[str, ...]
    question: str
    answers: tuple[str, ...]
    extra: dict[str, object] = field(default_factory=dict)
    support: tuple[str, ...] = ()


@dataclass(slots=True)
class Pools:
    """Per-document pools drawn without replacement, so no subject repeats within a document."""

    rng: random.Random
    names: list[str] = field(default_factory=list)
    colors: list[str] = field(default_factory=list)
    cities: list[str] = field(default_factory=list)
    animals: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.names = self.rng.sample(NAMES, len(NAMES))
        self.colors = self.rng.sample(COLORS, len(COLORS))
        self.cities = self.rng.sample(CITIES, len(CITIES))
        self.animals = self.rng.sample(ANIMALS, len(ANIMALS))


def _code(pools: Pools) -> Fact:
    color, code = pools.colors.pop(), str(pools.rng.randint(1000, 9999))
    return Fact(
        "needle",
        "code",
        (f"The secret code of the {color} door is {code}.",),
        f"What is the secret code of the {color} door?",
        (code,),
    )


def _activity(pools: Pools) -> Fact:
    city, activity = pools.cities.pop(), pools.rng.choice(ACTIVITIES)
    return Fact(
        "needle",
        "activity",
        (f"The best thing to do in {city} is {activity}.",),
        f"What is the best thing to do in {city}?",
        (activity,),
    )


def _lucky(pools: Pools) -> Fact:
    name, number = pools.names.pop(), str(pools.rng.randint(10, 999))
    return Fact(
        "needle",
        "lucky-number",
        (f"{name}'s lucky number is {number}.",),
        f"What is {name}'s lucky number?",
        (number,),
    )


def _key(pools: Pools) -> Fact:
    name, place = pools.names.pop(), pools.rng.choice(HIDING_PLACES)
    return Fact(
        "needle",
        "spare-key",
        (f"{name} hid the spare key under the {place}.",),
        f"Where did {name} hide the spare key?",
        (f"under the {place}", place),
    )


def _pet(pools: Pools) -> Fact:
    name, animal, pet = pools.names.pop(), pools.animals.pop(), pools.rng.choice(PET_NAMES)
    return Fact(
        "needle",
        "pet-name",
        (f"{name}'s {animal} is named {pet}.",),
        f"What is the name of {name}'s {animal}?",
        (pet,),
    )


SINGLE_TEMPLATES = (_code, _activity, _lucky, _key, _pet)


def single_facts(pools: Pools, count: int) -> list[Fact]:
    """`count` lookup facts from distinct templates (repeating templates only past five)."""
    order = pools.rng.sample(range(len(SINGLE_TEMPLATES)), len(SINGLE_TEMPLATES))
    return [SINGLE_TEMPLATES[order[i % len(order)]](pools) for i in range(count)]


def multihop_fact(pools: Pools) -> Fact:
    """A two-hop question: neither sentence alone answers it; the bridge entity links them."""
    first, second = pools.names.pop(), pools.names.pop()
    if pools.rng.random() < 0.5:
        year = str(pools.rng.randint(1950, 1999))
        sentences = (f"{first} was born in the same year as {second}.", f"{second} was born in {year}.")
        return Fact("multihop", "birth-year", sentences, f"In what year was {first} born?", (year,))
    city = pools.cities.pop()
    sentences = (f"{first}'s sister is {second}.", f"{second} lives in {city}.")
    return Fact("multihop", "sister-city", sentences, f"In which city does {first}'s sister live?", (city,))


def _var_name(rng: random.Random, taken: set[str]) -> str:
    while True:
        name = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if name not in taken:
            taken.add(name)
            return name


def variable_chain(rng: random.Random, hops: int, value: int, taken: set[str]) -> tuple[list[str], list[str]]:
    """RULER variable tracking: `VAR A = value.`, then `VAR B = VAR A.` ... `hops` times.

    Returns (variable names in assignment order, the assignment sentences in that order).
    """
    names = [_var_name(rng, taken) for _ in range(hops + 1)]
    sentences = [f"VAR {names[0]} = {value}."]
    sentences += [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, hops + 1)]
    return names, sentences


def vartrack_facts(rng: random.Random, hops: int) -> list[Fact]:
    """Two interleavable chains (one is the other's distractor) and the questions about them."""
    taken: set[str] = set()
    value_a, value_b = rng.sample(range(10000, 99999), 2)
    names_a, chain_a = variable_chain(rng, hops, value_a, taken)
    names_b, chain_b = variable_chain(rng, hops, value_b, taken)
    all_q = f"Find all variables that are assigned the value {value_a} in the text."
    return [
        Fact(
            "vartrack",
            "chain-value",
            tuple(chain_a),
            f"What is the value of VAR {names_a[-1]}?",
            (str(value_a),),
        ),
        Fact(
            "vartrack",
            "chain-value",
            tuple(chain_b),
            f"What is the value of VAR {names_b[-1]}?",
            (str(value_b),),
        ),
        # Answer order follows the text; a set answer should be scored with scoring.contains_all.
        Fact(
            "vartrack", "all-variables", (), all_q, (" ".join(names_a),), {"all_of": names_a}, tuple(chain_a)
        ),
    ]


def counting_fact(rng: random.Random) -> Fact:
    """Delivery-log sentences for two fruits; the question counts one of them (a distractor count)."""
    fruit, other = rng.sample(FRUITS, 2)
    count, other_count = rng.randint(2, 4), rng.randint(1, 3)
    days = rng.sample(WEEKDAYS, count + other_count)
    kinds = [fruit] * count + [other] * other_count
    rng.shuffle(kinds)
    sentences = tuple(
        f"Delivery log: a crate of {f} arrived on {d}." for f, d in zip(kinds, days, strict=True)
    )
    question = f"According to the delivery log, how many crates of {fruit} arrived?"
    return Fact("count", "delivery-count", sentences, question, (str(count), NUMBER_WORDS[count]))
