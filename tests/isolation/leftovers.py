"""What tests/isolation/test_1_leaves_rows.py left behind, for test_2_starts_fresh.py to look for."""

LEFT: dict[str, dict] = {}  # by dialect: the database, and the ids of the rows left in it
