"""A tree family that lives outside specbench: its folder (this one) plus one registry line, as a new family's is."""
