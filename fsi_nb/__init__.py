"""A notebook-first research kit for training small, novel-architecture code language models from scratch"""

__version__ = "0.0.1"
