"""What every tree method shares: the tree method (method.py: the decoding step, batch 1 and batch > 1; step.py: verify
and accept), a tree state laid out for a step (layout.py), which tree a method decodes with at each batch size
(plan.py: the one place --tree is resolved into a TreePlan) and the Guesser protocol (guesser.py) each family implements in its own folder (methods/ppd,
methods/medusa, methods/eagle, methods/hidden_transfer).

Adding a tree method: a folder with a Guesser subclass and a @register'd TreeMethod naming it, imported by
methods/__init__.py.
"""
