"""A notebook-first research kit for training small, novel-architecture code language models from scratch

Modules:

- `fsi_nb.compare`: Runs side by side: loss against tokens, training FLOPs and wall time, and one table of what each run is and what it reached. The question it answers first: does the hybrid beat a plain transformer on the same data?"""

__version__ = "0.0.1"
