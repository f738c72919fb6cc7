"""Asking the servers: the questions of each look (stages), a group's baseline rounds and their
background A/A re-run, and one cell's P/D looks until the judge decides (cell_eval)."""
