"""Training of the small artefacts some methods need: one module per artefact (prompt tokens, ...)."""
