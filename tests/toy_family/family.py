"""The toy family's declaration: a dynamic-tree family (PPD's prompt-token guesses, untrained), torch-free."""

from specbench.families import Family

TOY = Family("toy", "tree", "tests.toy_family.guesser", scorer="tests.toy_family.guesser:ToyTokens.scorer")
