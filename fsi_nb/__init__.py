"""A notebook-first research kit for training small, novel-architecture code language models from scratch"""

# Written by hand (nbdev writes only the docstring and __version__ here). PyTorch's OpenMP threads spin while they wait
# for each other; when another program holds a core, the spinning slows training several times over (docs, Lab notes:
# "Training next to other work"). OpenMP reads its wait policy once, when torch loads it, so it is chosen here,
# before any fsi_nb module imports torch; a value already in the environment wins.
import os as _os
_os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

__version__ = "0.0.1"
