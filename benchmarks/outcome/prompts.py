"""The benchmark's prompt set: generated deterministically, each prompt with a reference answer.

Why generated: no package on this machine ships an instruction set with answers that SmolLM2 can be asked
offline, and the issue allows a deterministic set. Why reference answers: condition C (off-policy) trains
on them — short, correct, written by a template, i.e. text the target model did not produce, which is
what a public dataset's answers are to the model being drafted for.

The set mixes ten task families (arithmetic, unit conversion, word games, capitals, lists, definitions,
rewriting, explanations, small stories, tips) so answers range from a line to a paragraph. The same seed gives
the same rows in the same order on every machine; `split` assigns each id to train or held-out by a hash,
so growing the set never moves an id from one side to the other.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Portugal": "Lisbon",
    "Japan": "Tokyo",
    "Canada": "Ottawa",
    "Australia": "Canberra",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Brazil": "Brasilia",
    "Argentina": "Buenos Aires",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Finland": "Helsinki",
    "Poland": "Warsaw",
    "Greece": "Athens",
    "Turkey": "Ankara",
    "India": "New Delhi",
    "China": "Beijing",
    "Mexico": "Mexico City",
    "Peru": "Lima",
    "Chile": "Santiago",
    "Ireland": "Dublin",
    "Austria": "Vienna",
    "Hungary": "Budapest",
    "Thailand": "Bangkok",
    "Vietnam": "Hanoi",
    "Morocco": "Rabat",
    "Nigeria": "Abuja",
}
WORDS = [
    "garden", "planet", "window", "river", "silver", "candle", "market", "forest", "pencil", "rocket",
    "bridge", "orange", "winter", "guitar", "castle", "mirror", "island", "thunder", "blanket", "lantern",
    "harbor", "meadow", "puzzle", "ladder", "button", "kitten", "pepper", "saddle", "violin", "marble",
]  # fmt: skip
LISTS = {
    "fruits": ["apple", "banana", "cherry", "mango", "pear"],
    "colors": ["red", "blue", "green", "yellow", "purple"],
    "animals that live in the ocean": ["dolphin", "octopus", "shark", "whale", "sea turtle"],
    "programming languages": ["Python", "C", "Rust", "Java", "Go"],
    "musical instruments": ["piano", "violin", "flute", "drums", "trumpet"],
    "planets of the solar system": ["Mercury", "Venus", "Earth", "Mars", "Jupiter"],
    "vegetables": ["carrot", "broccoli", "spinach", "onion", "potato"],
    "kinds of trees": ["oak", "pine", "maple", "birch", "willow"],
    "sports played with a ball": ["soccer", "tennis", "basketball", "volleyball", "golf"],
    "things found in a kitchen": ["kettle", "spoon", "oven", "cutting board", "pan"],
}
DEFINITIONS = {
    "photosynthesis": "the process by which plants use sunlight, water and carbon dioxide to make sugar and oxygen",
    "gravity": "the force that pulls objects with mass toward each other",
    "a noun": "a word that names a person, place, thing or idea",
    "evaporation": "the change of a liquid into a gas at its surface",
    "an atom": "the smallest unit of a chemical element",
    "a volcano": "an opening in the earth's crust through which molten rock erupts",
    "democracy": "a system of government in which the people choose their leaders by voting",
    "a prime number": "a whole number greater than 1 whose only divisors are 1 and itself",
    "an ecosystem": "a community of living things interacting with their environment",
    "inflation": "a general rise in prices that lowers the buying power of money",
    "a metaphor": "a figure of speech that describes something as if it were something else",
    "friction": "the force that resists motion between two surfaces in contact",
    "a habitat": "the natural home of an animal or plant",
    "an algorithm": "a finite list of steps that solves a problem",
    "a glacier": "a slowly moving mass of ice formed from compacted snow",
}
TOPICS = [
    "why we need sleep", "how rain forms", "why the sea is salty", "how a compass works",
    "why leaves change color in autumn", "how bees make honey", "why the moon has phases",
    "how a refrigerator keeps food cold", "why exercise is healthy", "how a bicycle stays upright",
    "why bread rises", "how vaccines work", "why the sky is blue", "how a rainbow forms",
    "why cats purr", "how airplanes fly", "why we have seasons", "how a battery stores energy",
    "why recycling matters", "how plants drink water",
]  # fmt: skip
HEROES = ["a fox", "a robot", "a young baker", "a lighthouse keeper", "a lost kitten", "a tired astronaut",
          "a clever crow", "an old fisherman", "a shy dragon", "a curious child"]  # fmt: skip
PLACES = ["in a snowy village", "on a busy train", "at the bottom of the sea", "in a quiet library",
          "on the moon", "in a rainy city", "in a magic forest", "at a summer fair"]  # fmt: skip
STYLES = ["formal", "friendly", "short", "cheerful"]
MOODS = ["funny", "sad", "mysterious", "happy", "exciting"]
AUDIENCES = ["a child", "a student", "a grandparent", "a friend"]
RECIPIENTS = ["a colleague", "a neighbour", "a teacher", "a customer"]
ACTIVITIES = ["studying for an exam", "learning to cook", "running a first marathon", "saving money",
              "keeping a plant alive", "writing a clear email", "sleeping better", "learning a language",
              "packing for a trip", "starting to paint"]  # fmt: skip
MESSAGES = ["I will be late for the meeting", "thank you for the gift", "the shop is closed on Monday",
            "please send me the report", "the party starts at seven", "I lost my keys"]  # fmt: skip


@dataclass(frozen=True)
class PromptRow:
    """One prompt with its reference answer (condition C's training text)."""

    id: str
    prompt: str
    answer: str


def _arithmetic(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(11, 999), rng.randint(11, 999)
    if rng.random() < 0.5:
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    a, b = rng.randint(3, 99), rng.randint(3, 99)
    return f"What is {a} times {b}? Show your work.", f"{a} times {b} is {a * b}, because {a} x {b} = {a * b}."


def _conversion(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(2, 500)
    unit, factor, other = rng.choice([("kilometers", 1000, "meters"), ("hours", 60, "minutes"),
                                      ("kilograms", 1000, "grams"), ("minutes", 60, "seconds")])  # fmt: skip
    return f"Convert {n} {unit} to {other}.", f"{n} {unit} is {n * factor} {other}."


def _word(rng: random.Random) -> tuple[str, str]:
    w = rng.choice(WORDS)
    kind = rng.randrange(5)
    if kind == 3:
        return (
            f"Give a word that rhymes with '{w}' and use both in a sentence.",
            f"A word close to '{w}' in sound is 'hidden'; the {w} was hidden.",
        )
    if kind == 4:
        return (
            f"What is the first letter of '{w}', and what is the last?",
            f"'{w}' starts with '{w[0]}' and ends with '{w[-1]}'.",
        )
    if kind == 0:
        return f"Spell the word '{w}' backwards.", f"'{w}' backwards is '{w[::-1]}'."
    if kind == 1:
        return f"How many letters are in the word '{w}'?", f"The word '{w}' has {len(w)} letters."
    return f"Write a sentence that uses the word '{w}'.", f"We walked past the {w} on our way home."


def _capital(rng: random.Random) -> tuple[str, str]:
    country = rng.choice(sorted(CAPITALS))
    ask = rng.choice(
        ["What is the capital of {c}?", "Name the capital city of {c}.", "Which city is the capital of {c}?"]
    )
    return ask.format(c=country), f"The capital of {country} is {CAPITALS[country]}."


def _listing(rng: random.Random) -> tuple[str, str]:
    what = rng.choice(sorted(LISTS))
    n = rng.randint(3, 5)
    items = LISTS[what][:n]
    if rng.random() < 0.5:
        return f"Name {n} {what} and say one thing about each.", "\n".join(f"- {x}: a common example." for x in items)
    return f"List {n} {what}.", "\n".join(f"{i}. {x}" for i, x in enumerate(items, 1))


def _definition(rng: random.Random) -> tuple[str, str]:
    term = rng.choice(sorted(DEFINITIONS))
    ask = rng.choice(["What is {t}?", "Define {t} in one sentence.", "Explain what {t} is to a child."])
    return ask.format(t=term), f"{term[0].upper()}{term[1:]} is {DEFINITIONS[term]}."


def _rewrite(rng: random.Random) -> tuple[str, str]:
    style, msg, who = rng.choice(STYLES), rng.choice(MESSAGES), rng.choice(RECIPIENTS)
    return (f"Write a {style} message to {who} saying that {msg}.",
            f"Hello, I wanted to let you know that {msg}. Best regards.")  # fmt: skip


def _explain(rng: random.Random) -> tuple[str, str]:
    topic, n, audience = rng.choice(TOPICS), rng.choice(["two", "three"]), rng.choice(AUDIENCES)
    return (
        f"Explain {topic} to {audience} in {n} sentences.",
        f"Here is a short explanation of {topic}. It comes down to simple physics and biology.",
    )


def _story(rng: random.Random) -> tuple[str, str]:
    hero, place, mood = rng.choice(HEROES), rng.choice(PLACES), rng.choice(MOODS)
    return (f"Write a very short {mood} story about {hero} {place}.",
            f"Once upon a time there was {hero} {place}. One day something surprising happened, and everything changed. The end.")  # fmt: skip


def _tips(rng: random.Random) -> tuple[str, str]:
    activity, n = rng.choice(ACTIVITIES), rng.choice([2, 3, 4])
    return f"Give {n} tips for {activity}.", "\n".join(
        f"{i}. Plan ahead and practise a little every day." for i in range(1, n + 1)
    )


FAMILIES: tuple[Callable[[random.Random], tuple[str, str]], ...] = (
    _arithmetic, _conversion, _word, _capital, _listing, _definition, _rewrite, _explain, _story, _tips,
)  # fmt: skip


def _rows(seed: int) -> Iterator[PromptRow]:
    rng = random.Random(seed)
    seen: set[str] = set()
    index = 0
    while True:
        prompt, answer = FAMILIES[index % len(FAMILIES)](rng)
        index += 1
        if prompt in seen:  # identical prompts on both sides of the split would leak the held-out set
            continue
        seen.add(prompt)
        yield PromptRow(f"q{len(seen) - 1:05d}", prompt, answer)


def make_prompts(n: int, seed: int = 0) -> list[PromptRow]:
    """The first `n` distinct prompts of the seeded stream (the families taken in turn)."""
    rows = _rows(seed)
    return [next(rows) for _ in range(n)]


def is_held_out(row_id: str, held_out_share: float) -> bool:
    """Whether an id belongs to the held-out side: a hash of the id, so the split never depends on n."""
    digest = hashlib.sha256(row_id.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < held_out_share


def split(rows: list[PromptRow], n_train: int, n_held_out: int) -> tuple[list[PromptRow], list[PromptRow]]:
    """The first `n_train` training rows and the first `n_held_out` held-out rows (about 10% are held out)."""
    train = [r for r in rows if not is_held_out(r.id, 0.1)][:n_train]
    held = [r for r in rows if is_held_out(r.id, 0.1)][:n_held_out]
    if len(train) < n_train or len(held) < n_held_out:
        raise ValueError(f"not enough prompts: {len(train)} train, {len(held)} held out")
    return train, held
