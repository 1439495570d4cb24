"""What every tree method shares: the tree method (method.py: the decoding step, batch 1 and batch > 1; step.py: verify
and accept with the acceptance rule it is given, accept_rule.py), a tree state laid out for a step (layout.py), which
tree a method decodes with at each batch size (batch_trees.py: the one place --tree is resolved into a BatchTree),
and the three roles each family implements in its own folder (methods/ppd, methods/medusa, methods/hidden_transfer,
methods/eagle, methods/parallelspec): the artefact (guesser.py: Guesser, with the scorer for `estimate`), the tree
shapes it takes (shapes.py: TreeShapes) and the decode-time proposer (proposer.py: Proposer, propose / advance with
the batch size's tree passed in and a typed state per sample).

Adding a tree method: a folder with a Guesser subclass naming its shapes and proposer, and a @register'd TreeMethod
naming the Guesser, imported by methods/__init__.py.
"""
