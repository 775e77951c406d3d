"""The layout a pass travels in and the model reads (engines/passes.py writes it,
columns.py and columns_triton.py expand it): one place for both sides."""

IDS, POS, LO_FULL, LO_SLIDE, END = range(5)  # the rows of columns()
HEADER = 2  # T, C
FIELDS = 6  # pos0, lo_full, end, before, follow, start
START = 5
