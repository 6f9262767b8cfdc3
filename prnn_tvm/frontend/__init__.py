"""The front end: how a cell is written, traced, analysed into a plan, and found by name."""
