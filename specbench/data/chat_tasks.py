"""Everyday chat requests from templates (the `chat-tasks` training source): writing, explaining, advice, planning,
comparison, role play and reasoning requests about topics drawn from word lists by a per-index seeded RNG, the
template cycling with the index. Written for this project (not taken from any benchmark or instruction set), so a
training mix can have more chat than AlpacaEval's 805 instructions without touching a benchmark prompt."""

from __future__ import annotations

import random

TOPICS = ["photosynthesis", "black holes", "the water cycle", "inflation", "vaccines", "volcanoes", "plate "
          "tectonics", "the immune system", "machine learning", "the printing press", "compound interest",
          "climate change", "the French Revolution", "DNA", "electric cars", "the internet", "honeybees",
          "recycling", "the Roman Empire", "renewable energy", "sleep", "coral reefs", "supply and demand",
          "the solar system", "antibiotics", "democracy", "the stock market", "earthquakes", "glaciers",
          "the human heart", "jazz", "impressionist painting", "the Silk Road", "tides", "rainbows",
          "bread baking", "cryptography", "gravity", "memory", "bird migration"]
ACTIVITIES = ["learning a new language", "running a first marathon", "starting a vegetable garden", "saving "
              "money", "working from home", "studying for exams", "cooking for a large family", "learning to "
              "draw", "keeping a houseplant alive", "moving to a new city", "public speaking", "training a puppy",
              "writing a novel", "staying focused", "hosting a dinner party", "taking better photos",
              "learning to swim", "organizing a small office", "reducing screen time", "camping in the rain"]
PLACES = ["Lisbon", "Kyoto", "a small mountain village", "Cape Town", "Montreal", "a seaside town", "Istanbul",
          "Mexico City", "Edinburgh", "a national park", "Hanoi", "Buenos Aires", "Vienna", "a desert oasis"]
ROLES = ["ship captain", "museum guide", "detective", "chef", "astronaut", "gardener", "librarian", "park ranger",
         "history teacher", "travel agent", "football coach", "lighthouse keeper", "baker", "tour guide"]
THINGS = ["a bicycle", "a violin", "a paper map", "a teapot", "an umbrella", "a compass", "a typewriter",
          "a kite", "a lantern", "a chess set", "a wristwatch", "a telescope", "a library card", "a seashell"]
PAIRS = [("trains", "planes"), ("cats", "dogs"), ("tea", "coffee"), ("books", "films"), ("city life",
         "country life"), ("solar power", "wind power"), ("e-books", "paper books"), ("running", "cycling"),
         ("renting", "buying a home"), ("a gap year", "going straight to university"), ("Python", "JavaScript"),
         ("oceans", "mountains")]
AUDIENCES = ["a ten-year-old", "a busy manager", "my grandmother", "a new employee", "a high-school class",
             "a friend who is skeptical"]

# Each template's fields: topic, activity, place, role, thing, x / y (a pair to compare), audience, n (a count
# 3-7), days (2-5), words (50-200).
TEMPLATES = [
    "Explain {topic} to {audience}.",
    "Give me {n} practical tips for {activity}.",
    "Write a short poem of {n} lines about {topic} for {audience}.",
    "What are the pros and cons of {x} compared with {y}?",
    "Plan a {days}-day trip to {place} for someone who loves food and history.",
    "Pretend you are a {role}. Describe a typical day at work.",
    "Write a short story, about {words} words, in which a child finds {thing}.",
    "Write a polite email to my neighbour asking them to help with {activity} next weekend.",
    "Summarize the main ideas of {topic} in {n} bullet points.",
    "I want to get better at {activity}. Make me a {days}-week plan.",
    "What are common misconceptions about {topic}?",
    "Write a persuasive paragraph arguing for {x} over {y}.",
    "Describe {thing} to {audience} who has never seen one, in {n} sentences.",
    "As a {role}, answer this question from a visitor: why does {topic} matter?",
    "Give {n} interesting facts about {topic} that would surprise {audience}.",
    "Write a haiku about {thing} on a {days}-day journey to {place}.",
    "What questions should I ask before {activity}?",
    "Create a short quiz with {n} questions about {topic}, with answers.",
    "Write a dialogue between a {role} and a tourist visiting {place}.",
    "Explain the difference between {x} and {y} in simple terms.",
    "Suggest {n} names for a cafe in {place}, and explain each briefly.",
    "What would happen if {topic} suddenly stopped existing? Think it through step by step.",
    "Write a limerick about a {role} who lost {thing}.",
    "How can a school teach {topic} in an engaging way?",
    "Write a product description for {thing} in about {words} words.",
    "My friend says {x} are better than {y}. Help me reply with a balanced view.",
    "Give me a packing list for {days} days in {place}.",
    "Write a short speech to welcome new members to a club about {activity}.",
    "Outline an essay about the history of {topic}.",
    "What skills does a good {role} need, and how can someone learn them?",
]


def chat_task(index: int) -> str:
    """The index-th templated chat request (template index % len(TEMPLATES), fields from Random(index))."""
    rng = random.Random(index)
    x, y = rng.choice(PAIRS)
    fields = {"topic": rng.choice(TOPICS), "activity": rng.choice(ACTIVITIES), "place": rng.choice(PLACES),
              "role": rng.choice(ROLES), "thing": rng.choice(THINGS), "x": x, "y": y,
              "audience": rng.choice(AUDIENCES), "n": rng.randint(3, 7), "days": rng.randint(2, 5),
              "words": rng.choice([50, 80, 100, 150, 200])}
    return TEMPLATES[index % len(TEMPLATES)].format(**fields)
