"""Storage of an experiment: the one SQLite database and its schema."""
