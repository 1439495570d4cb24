"""What every tree method shares: the engine (engine.py: the decoding step, batch 1 and batch > 1; step.py: verify
and accept), a tree state laid out for a step (layout.py), which tree a method decodes with (resolution.py,
batch_trees.py) and the Guesser protocol (guesser.py) each family implements in its own folder (methods/ppd,
methods/medusa, methods/eagle, methods/hidden_transfer).

Adding a tree method: a folder with a Guesser subclass and a @register'd TreeMethod naming it, imported by
methods/__init__.py.
"""
