"""Grade-school word problems from templates (the `word-problems` training source): names, items and numbers drawn
from a per-index seeded RNG, the template cycling with the index. Only the questions matter: the answers distilled
are the target's own. 40 templates (the first 16 are the source's original ones) of one to three steps: counting,
money, rates, time, percentages, ratios, ages, geometry and units."""

from __future__ import annotations

import random

NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kate", "Liam",
         "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Zoe",
         "Aisha", "Bruno", "Carmen", "Dmitri", "Elif", "Femi", "Greta", "Hassan", "Ingrid", "Jonas", "Keiko",
         "Luca", "Mei", "Nadia", "Omar", "Paulo", "Rahul", "Sofia", "Tomas", "Yara"]
ITEMS = ["apples", "books", "stickers", "marbles", "cupcakes", "pencils", "stamps", "cookies", "shells", "cards",
         "oranges", "toy cars", "beads", "crayons", "muffins", "coins", "flowers", "eggs", "balloons", "puzzles"]
GOODS = [("notebook", "notebooks"), ("sandwich", "sandwiches"), ("ticket", "tickets"), ("plant", "plants"),
         ("shirt", "shirts"), ("bracelet", "bracelets"), ("backpack", "backpacks"), ("lamp", "lamps"),
         ("board game", "board games"), ("pair of shoes", "pairs of shoes"), ("mug", "mugs"), ("kite", "kites")]
PLACES = ["the park", "school", "the library", "the beach", "the museum", "the market", "the zoo", "the lake"]

# Each template's fields: a, b, c (people), item (plural), good / goods, place, n1..n4 (counts: n1 2-12, n2 2-15,
# n3 2-9, n4 20-120), p1, p2 (prices: 2-25, 40-200), pct (a percentage), h (hours), r (a rate), m (minutes).
TEMPLATES = [
    "{a} has {n1} {item}. {b} gives {a} {n2} more, and then {a} gives away {n3}. How many {item} does {a} have "
    "now?",
    "{a} buys {n1} {goods} at ${p1} each and {n2} more at ${p2} each. How much does {a} spend in total?",
    "A box holds {n4} {item}. {a} fills {n1} boxes and has {n3} {item} left over. How many {item} did {a} have?",
    "{a} earns ${r} an hour and works {h} hours a day for {n2} days. How much money does {a} earn?",
    "{a} reads {n3} pages every day. The book has {n4} pages more than {n1} times that. How many days does it "
    "take {a} to finish the book?",
    "A {good} costs ${p1}. It is on sale for {pct}% off. {a} buys {n2} of them. How much does {a} pay?",
    "{a} is {n2} years older than {b}. In {n3} years {b} will be {n4}. How old is {a} now?",
    "{a} has ${p2}. {a} spends a quarter of it on {goods} and ${p1} on lunch. How much money is left?",
    "There are {n4} students in a school. {pct}% of them take the bus and the rest walk. How many students walk?",
    "{a} runs {n1} miles on Monday, twice as far on Tuesday and {n3} miles less than that on Wednesday. How many "
    "miles does {a} run in the three days?",
    "{a} and {b} share {n4} {item} so that {a} gets {n1} more than {b}. How many {item} does {b} get?",
    "A farm has {n4} chickens and {n2} cows. How many legs do the animals have altogether?",
    "{a} saves ${r} every week. How many weeks does it take to save enough for a {good} that costs ${p2}?",
    "A train travels at {r} miles per hour for {h} hours, then {n1} miles more. How far does it go in total?",
    "{a} bakes {n4} {item} and sells them in packs of {n1} for ${p1} a pack. How much money does {a} make if all "
    "full packs are sold?",
    "{a} had {n4} {item}. {a} lost {pct}% of them and then bought {n3} more. How many {item} does {a} have now?",
    # added for variety (prompts from index 16 on use these too)
    "{a}, {b} and {c} collect {item}. {a} has {n1}, {b} has three times as many as {a}, and {c} has {n3} fewer "
    "than {b}. How many {item} do they have together?",
    "A rectangular garden is {n4} feet long and {n1} feet wide. {a} wants to put a fence around it. How many feet "
    "of fence does {a} need?",
    "{a} walks to {place} in {m} minutes and walks back in {n3} minutes less. How many minutes does {a} walk in "
    "all?",
    "{a} buys {n2} {goods} for ${p2} in total. How much does one of them cost, to the nearest cent?",
    "The ratio of {item} to {goods} in a shop is {n3} to {n1}. There are {n4} {item}. How many {goods} are there?",
    "{a} fills a {n4}-liter tank with water at {n3} liters per minute. The tank already had {n2} liters. How many "
    "minutes does it take to fill it?",
    "A movie starts at {h}:15 pm and lasts {m} minutes more than {n1} hours. At what time does it end?",
    "{a} scored {n4}, {n2} more than that, and {n3} less than the first score in three games. What is the "
    "average score?",
    "{a} has {n4} {item} and gives {b} one fifth of them. {b} gives half of what {b} received to {c}. How many "
    "{item} does {c} get?",
    "A bakery makes {n4} loaves a day and sells {pct}% of them. The rest are given away. How many loaves are "
    "given away in {n1} days?",
    "{a} pays ${p2} for {n1} {goods} and {n3} bags. Each bag costs ${p1}. How much does one of the {goods} cost?",
    "A pool is {n1} meters wide and {n4} meters long. {a} swims {n3} lengths. How many meters does {a} swim?",
    "{a} is twice as old as {b}. {n1} years ago {a} was {n4} years old. How old is {b} now?",
    "{a} plants {n2} rows of flowers with {n1} flowers in each row. {pct}% of them bloom. How many flowers bloom?",
    "A car uses {n3} liters of fuel every 100 kilometers. How many liters does it need for a trip of {n4}0 "
    "kilometers?",
    "{a} gets ${r} of pocket money a week and spends ${n3} of it each week. After {n2} weeks, how much has "
    "{a} saved?",
    "There are {n4} seats on a bus. {n2} people get off at the first stop and {n1} get on. If the bus was full, "
    "how many empty seats are there now?",
    "{a} cuts a ribbon {n4} centimeters long into pieces of {n1} centimeters. How many whole pieces does {a} get, "
    "and how long is the piece left over?",
    "A printer prints {r} pages a minute. How many minutes does it take to print {n2} copies of a {n3}-page "
    "report?",
    "{a} buys a {good} for ${p2} and sells it for {pct}% more. How much profit does {a} make?",
    "In a class of {n4} students, {n2} play football, {n1} play chess and {n3} play both. How many play neither?",
    "{a} drinks {n3} glasses of water a day, each of 250 milliliters. How many liters does {a} drink in {n2} "
    "days?",
    "{a} and {b} paint a fence together. {a} alone takes {h} hours and {b} alone takes {n1} hours. How long do "
    "they take together?",
    "A shop sells {item} at {n1} for ${p1}. How much do {n4} {item} cost?",
]


def word_problem(index: int) -> str:
    """The index-th templated word problem (template index % len(TEMPLATES), fields from Random(index))."""
    rng = random.Random(index)
    a, b, c = rng.sample(NAMES, 3)
    good, goods = rng.choice(GOODS)
    fields = {"a": a, "b": b, "c": c, "item": rng.choice(ITEMS), "good": good, "goods": goods,
              "place": rng.choice(PLACES), "n1": rng.randint(2, 12), "n2": rng.randint(2, 15),
              "n3": rng.randint(2, 9), "n4": rng.randint(20, 120), "p1": rng.randint(2, 25),
              "p2": rng.randint(40, 200), "pct": rng.choice([10, 20, 25, 30, 40, 50, 75]), "h": rng.randint(2, 9),
              "r": rng.randint(8, 60), "m": rng.randint(12, 55)}
    return TEMPLATES[index % len(TEMPLATES)].format(**fields)
